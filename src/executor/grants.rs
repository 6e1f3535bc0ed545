//! Folder grants: what `agentworks executor connect` shares, validated before it connects.
//!
//! Owns: turning `--folder`, `--write-folder`, `--block`, `--read-only` and `--downloads` into
//! canonical, checked [`Grants`]; the permissions text printed before connecting; the
//! [`SandboxPolicy`] a request on one folder runs under; the patch [`Guard`] of a folder; and the
//! aliases the server sees (base names, de-duplicated; never absolute paths).
//!
//! Must never: share the home directory, one of its parents, `/`, or a folder that contains (or
//! lies inside) the CLI's credentials or private state; skip a grant that cannot be opened;
//! let a request on one folder reach another shared folder (only its own `--downloads`
//! companion); widen a read-only folder nested in a writable one. Paths are compared canonical
//! and component by component (`Path::starts_with`), never as strings.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::gateway::protocol::{FolderAccess, FolderInfo};
use crate::guard::{Guard, RelPath};

use super::config::Dirs;
use super::sandbox::SandboxPolicy;

/// Why the grants were refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("nothing to share: give at least one --folder or --write-folder")]
    Nothing,
    #[error("cannot share {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot share {path}: it is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("refusing to share {path}: it is {what}; share individual project folders instead")]
    TooWide { path: PathBuf, what: &'static str },
    #[error(
        "refusing to share {path}: it contains the CLI's private {what} ({private}); share a folder that does not"
    )]
    ContainsPrivate {
        path: PathBuf,
        what: &'static str,
        private: PathBuf,
    },
    #[error("refusing to share {path}: it lies inside the CLI's private {what} ({private})")]
    InsidePrivate {
        path: PathBuf,
        what: &'static str,
        private: PathBuf,
    },
    #[error("{path} is shared twice; give each folder once")]
    Duplicate { path: PathBuf },
    #[error("{flag} {path} does not lie inside any shared folder")]
    Outside { flag: &'static str, path: PathBuf },
    #[error("cannot resolve {path}: {source}")]
    Resolve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The raw command-line grants.
#[derive(Debug, Clone, Default)]
pub struct GrantArgs {
    pub folders: Vec<PathBuf>,
    pub write_folders: Vec<PathBuf>,
    pub block: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    pub downloads: bool,
}

/// One shared folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    pub alias: String,
    /// Canonical.
    pub path: PathBuf,
    pub access: FolderAccess,
}

/// Validated grants, every path canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub folders: Vec<Folder>,
    /// `--block` paths (canonical; the missing tail of a path that does not exist yet is kept).
    pub blocked: Vec<PathBuf>,
    /// `--read-only` paths.
    pub read_only: Vec<PathBuf>,
    /// `~/Downloads`, when `--downloads` was given.
    pub downloads: Option<PathBuf>,
    /// The CLI's private dirs (canonical where they exist), denied to every command.
    pub private: Vec<PathBuf>,
    /// Canonical home.
    pub home: PathBuf,
}

/// Canonicalise the longest existing prefix of `path` and append the rest (for paths that may
/// not exist yet: the CLI's dirs before the first login, a `--block` for a future file).
pub fn resolve_lenient(path: &Path) -> Result<PathBuf, GrantError> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map_err(|source| GrantError::Resolve {
                path: path.to_owned(),
                source,
            })?
            .join(path)
    };
    let mut existing = absolute.clone();
    let mut tail = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(mut resolved) => {
                for name in tail.iter().rev() {
                    resolved.push(name);
                }
                return Ok(resolved);
            }
            Err(source) => {
                let Some(name) = existing.file_name().map(ToOwned::to_owned) else {
                    return Err(GrantError::Resolve {
                        path: path.to_owned(),
                        source,
                    });
                };
                if name == ".." {
                    return Err(GrantError::Resolve {
                        path: path.to_owned(),
                        source,
                    });
                }
                tail.push(name);
                existing.pop();
            }
        }
    }
}

fn open_dir(path: &Path) -> Result<PathBuf, GrantError> {
    let canonical = std::fs::canonicalize(path).map_err(|source| GrantError::Open {
        path: path.to_owned(),
        source,
    })?;
    // Opening proves it can be read, not only stat-ed.
    std::fs::read_dir(&canonical).map_err(|source| match source.raw_os_error() {
        Some(libc::ENOTDIR) => GrantError::NotADirectory {
            path: path.to_owned(),
        },
        _ => GrantError::Open {
            path: path.to_owned(),
            source,
        },
    })?;
    if !canonical.is_dir() {
        return Err(GrantError::NotADirectory {
            path: path.to_owned(),
        });
    }
    Ok(canonical)
}

fn alias_for(path: &Path, taken: &mut HashSet<String>) -> String {
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "folder".to_owned());
    let mut alias = base.clone();
    let mut n = 2;
    while !taken.insert(alias.clone()) {
        alias = format!("{base}-{n}");
        n += 1;
    }
    alias
}

impl Grants {
    /// Validate the command-line grants against the person's home and the CLI's dirs.
    pub fn validate(args: &GrantArgs, dirs: &Dirs) -> Result<Grants, GrantError> {
        if args.folders.is_empty() && args.write_folders.is_empty() {
            return Err(GrantError::Nothing);
        }
        let home = resolve_lenient(&dirs.home)?;
        let private = [
            ("credentials", resolve_lenient(&dirs.config)?),
            ("state", resolve_lenient(&dirs.state)?),
        ];
        let check = |given: &Path, canonical: &Path| -> Result<(), GrantError> {
            if canonical == Path::new("/") {
                return Err(GrantError::TooWide {
                    path: given.to_owned(),
                    what: "the root of the filesystem",
                });
            }
            if canonical == home {
                return Err(GrantError::TooWide {
                    path: given.to_owned(),
                    what: "your home directory",
                });
            }
            if home.starts_with(canonical) {
                return Err(GrantError::TooWide {
                    path: given.to_owned(),
                    what: "a parent of your home directory",
                });
            }
            for (what, dir) in &private {
                if dir.starts_with(canonical) {
                    return Err(GrantError::ContainsPrivate {
                        path: given.to_owned(),
                        what,
                        private: dir.clone(),
                    });
                }
                if canonical.starts_with(dir) {
                    return Err(GrantError::InsidePrivate {
                        path: given.to_owned(),
                        what,
                        private: dir.clone(),
                    });
                }
            }
            Ok(())
        };

        let mut taken = HashSet::new();
        let mut folders: Vec<Folder> = Vec::new();
        let given = args
            .folders
            .iter()
            .map(|p| (p, FolderAccess::ReadOnly))
            .chain(
                args.write_folders
                    .iter()
                    .map(|p| (p, FolderAccess::ReadWrite)),
            );
        for (path, access) in given {
            let canonical = open_dir(path)?;
            check(path, &canonical)?;
            if folders.iter().any(|f| f.path == canonical) {
                return Err(GrantError::Duplicate {
                    path: path.to_owned(),
                });
            }
            folders.push(Folder {
                alias: alias_for(&canonical, &mut taken),
                path: canonical,
                access,
            });
        }
        let downloads = if args.downloads {
            let given = dirs.home.join("Downloads");
            let canonical = open_dir(&given)?;
            check(&given, &canonical)?;
            Some(canonical)
        } else {
            None
        };
        let inside = |flag: &'static str, raw: &[PathBuf]| -> Result<Vec<PathBuf>, GrantError> {
            raw.iter()
                .map(|p| {
                    let resolved = resolve_lenient(p)?;
                    if folders.iter().any(|f| resolved.starts_with(&f.path)) {
                        Ok(resolved)
                    } else {
                        Err(GrantError::Outside {
                            flag,
                            path: p.to_owned(),
                        })
                    }
                })
                .collect()
        };
        let blocked = inside("--block", &args.block)?;
        let read_only = inside("--read-only", &args.read_only)?;
        Ok(Grants {
            folders,
            blocked,
            read_only,
            downloads,
            private: private.into_iter().map(|(_, p)| p).collect(),
            home,
        })
    }

    pub fn folder(&self, alias: &str) -> Option<&Folder> {
        self.folders.iter().find(|f| f.alias == alias)
    }

    /// What the server is told: aliases and access, never paths.
    pub fn folder_infos(&self) -> Vec<FolderInfo> {
        self.folders
            .iter()
            .map(|f| FolderInfo {
                alias: f.alias.clone(),
                access: f.access,
                downloads: self.downloads.is_some(),
            })
            .collect()
    }

    /// The text printed before connecting: each folder's file and command permissions.
    pub fn permissions_text(&self) -> String {
        let mut out = String::from("Sharing these folders with the server:\n");
        for f in &self.folders {
            out.push_str(&format!("  {}  ({})\n", f.alias, f.path.display()));
            match f.access {
                FolderAccess::ReadOnly => out.push_str(
                    "    files: read-only (no patches)\n    commands: run in a read-only sandbox (they can read this folder, not change it)\n",
                ),
                FolderAccess::ReadWrite => out.push_str(
                    "    files: read and write (patches allowed)\n    commands: may change files here, including builds and tests\n",
                ),
            }
            for b in self.blocked.iter().filter(|b| b.starts_with(&f.path)) {
                out.push_str(&format!("    blocked: {}\n", b.display()));
            }
            for r in self.read_only.iter().filter(|r| r.starts_with(&f.path)) {
                out.push_str(&format!("    read-only: {}\n", r.display()));
            }
        }
        if let Some(d) = &self.downloads {
            out.push_str(&format!(
                "  Downloads ({}): read and write for commands of every shared folder ($AGENTWORKS_DOWNLOADS)\n",
                d.display()
            ));
        }
        out.push_str(
            "Commands have open network access (internet, localhost, local network).\n\
             File contents and command output are sent to the server and its model.\n\
             The CLI's credentials and receipts are never reachable by commands.\n",
        );
        out
    }

    /// The sandbox a request on `folder` runs under, with `scratch` as its private scratch dir.
    pub fn policy(&self, folder: &Folder, scratch: &Path) -> SandboxPolicy {
        let mut read_write = Vec::new();
        let mut read_only = Vec::new();
        let mut read_only_within: Vec<PathBuf> = Vec::new();
        match folder.access {
            FolderAccess::ReadOnly => read_only.push(folder.path.clone()),
            FolderAccess::ReadWrite => {
                read_write.push(folder.path.clone());
                read_only_within.extend(
                    self.read_only
                        .iter()
                        .filter(|r| r.starts_with(&folder.path))
                        .cloned(),
                );
                // A read-only folder shared inside this writable one stays read-only.
                read_only_within.extend(
                    self.folders
                        .iter()
                        .filter(|o| {
                            o.access == FolderAccess::ReadOnly
                                && o.path != folder.path
                                && o.path.starts_with(&folder.path)
                        })
                        .map(|o| o.path.clone()),
                );
            }
        }
        if let Some(downloads) = &self.downloads {
            read_write.push(downloads.clone());
        }
        SandboxPolicy {
            read_write,
            read_only,
            blocked: self.blocked.clone(),
            read_only_within,
            denied: self.private.clone(),
            home: Some(self.home.clone()),
            scratch: scratch.to_owned(),
            cwd: folder.path.clone(),
            limits: Default::default(),
        }
    }

    /// The guard patches on `folder` are checked against: the whole folder writable except its
    /// `--block` and `--read-only` paths and read-only folders nested in it. Paths a [`RelPath`]
    /// cannot name (dot components) are unreachable by patches anyway and are left out.
    pub fn guard(&self, folder: &Folder) -> Guard {
        let rel = |paths: &mut dyn Iterator<Item = &PathBuf>| -> Vec<String> {
            paths
                .filter_map(|p| p.strip_prefix(&folder.path).ok())
                .map(|p| p.to_string_lossy().into_owned())
                .filter(|p| !p.is_empty() && RelPath::parse(p).is_ok())
                .collect()
        };
        let blocked = rel(&mut self.blocked.iter());
        let mut read_only = rel(&mut self.read_only.iter());
        let nested: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|o| o.access == FolderAccess::ReadOnly && o.path != folder.path)
            .map(|o| o.path.clone())
            .collect();
        read_only.extend(rel(&mut nested.iter()));
        Guard {
            write_paths: vec![String::new()],
            blocked_paths: blocked,
            blocked_write_paths: Vec::new(),
            read_only_paths: read_only,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Dirs) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let home = root.join("home/me");
        for d in [
            "home/me/proj/sub",
            "home/me/docs",
            "home/me/.config",
            "other/proj",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let dirs = Dirs {
            config: home.join(".config/agentworks"),
            state: home.join(".local/state/agentworks"),
            home,
        };
        (dir, dirs)
    }

    fn args(folders: &[&Path], write: &[&Path]) -> GrantArgs {
        GrantArgs {
            folders: folders.iter().map(|p| p.to_path_buf()).collect(),
            write_folders: write.iter().map(|p| p.to_path_buf()).collect(),
            ..GrantArgs::default()
        }
    }

    #[test]
    fn refuses_home_parents_root_private_and_missing() {
        let (_dir, dirs) = setup();
        let home = dirs.home.clone();
        for bad in [
            home.clone(),
            home.parent().expect("parent").to_owned(),
            PathBuf::from("/"),
            home.join(".config"),
            home.join("missing"),
            home.join("proj/../../me"),
        ] {
            assert!(
                Grants::validate(&args(&[&bad], &[]), &dirs).is_err(),
                "{} was accepted",
                bad.display()
            );
        }
        let ok = Grants::validate(&args(&[&home.join("docs")], &[&home.join("proj")]), &dirs)
            .expect("valid");
        assert_eq!(ok.folders[0].alias, "docs");
        let mut a = args(&[], &[&home.join("proj")]);
        a.block = vec![home.join("docs/x")];
        assert!(matches!(
            Grants::validate(&a, &dirs),
            Err(GrantError::Outside { .. })
        ));
    }

    #[test]
    fn aliases_are_deduplicated_and_policy_is_per_folder() {
        let (dir, dirs) = setup();
        let root = dir.path().canonicalize().expect("canonical");
        let a = root.join("home/me/proj");
        let b = root.join("other/proj");
        let mut g = args(&[&b], &[&a]);
        g.block = vec![a.join("secret")];
        g.read_only = vec![a.join("sub")];
        let grants = Grants::validate(&g, &dirs).expect("valid");
        let aliases: Vec<_> = grants.folders.iter().map(|f| f.alias.as_str()).collect();
        assert_eq!(aliases, ["proj", "proj-2"]);
        let write = grants.folder("proj-2").expect("folder");
        let policy = grants.policy(write, &root.join("scratch"));
        assert_eq!(policy.read_write, vec![a.clone()]);
        assert!(
            policy.read_only.is_empty(),
            "other folders are not reachable"
        );
        assert_eq!(policy.read_only_within, vec![a.join("sub")]);
        assert_eq!(policy.blocked, vec![a.join("secret")]);
        assert_eq!(policy.denied.len(), 2);
        let guard = grants.guard(write);
        assert_eq!(guard.blocked_paths, ["secret"]);
        assert_eq!(guard.read_only_paths, ["sub"]);
        assert!(
            !serde_json::to_string(&grants.folder_infos())
                .expect("json")
                .contains('/')
        );
    }
}
