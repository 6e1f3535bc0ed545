//! Folder grants: what `agentworks executor connect` shares, validated before it connects.
//!
//! Owns: turning `--folder`, `--write-folder`, `--block`, `--read-only` and `--downloads` into
//! canonical, checked [`Grants`]; the permissions text printed before connecting; the
//! [`SandboxPolicy`] a request on one folder runs under; the patch [`Guard`] of a folder; and the
//! aliases the server sees (base names, de-duplicated; never absolute paths).
//!
//! Every shared folder, the Downloads companion and every toolchain folder is opened once, at
//! connect, as an `O_PATH` descriptor kept for the executor's life ([`PinnedDir`]); commands are
//! granted those descriptors, never a path resolved again later. A command that turns a path
//! into a symlink (`~/go/bin` → `$HOME`) therefore gains nothing, and a request whose shared
//! folder (or Downloads) no longer is the pinned directory is refused ([`Grants::check_pinned`]).
//! A toolchain folder inside a writable grant is not pinned as a toolchain: it is the agent's to
//! change, and its files are reachable through that grant anyway.
//!
//! `--downloads` links `~/Downloads` to the folder it follows on the command line, as the
//! console's generated command writes it: only that folder's commands and patches reach it (and
//! get `$AGENTWORKS_DOWNLOADS`); another folder, even one shared as a second alias on the same
//! connection, gets no Downloads.
//!
//! Must never: share the home directory, one of its parents, `/`, or a folder that contains (or
//! lies inside) the CLI's credentials or private state; skip a grant that cannot be opened;
//! let a request on one folder reach another shared folder (only the Downloads companion it was
//! linked to); widen a read-only folder nested in a writable one. Paths are compared canonical
//! and component by component (`Path::starts_with`), never as strings.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use agentworks_contract::executor::{FolderAccess, FolderInfo, MAX_FOLDERS, check_alias};
use agentworks_core::guard::{Guard, RelPath};

use super::config::Dirs;
use agentworks_sandbox::resolve::{ResolveError, resolve_lenient};
use agentworks_sandbox::{ExclusionMechanism, PinnedAccess, PinnedDir, SandboxPolicy};

/// Toolchain folders under the person's home that commands may read and execute (each pinned at
/// connect where it exists). Never the whole home.
pub const HOME_TOOLCHAINS: &[&str] = &[
    ".rustup",
    ".cargo",
    ".nvm",
    ".pyenv",
    ".volta",
    ".bun",
    ".deno",
    ".local/bin",
    ".local/lib",
    "go/bin",
    "go/pkg/mod",
];

/// Credential files inside the toolchain folders: denied to every command.
pub const HOME_TOOLCHAIN_SECRETS: &[&str] = &[".cargo/credentials", ".cargo/credentials.toml"];

/// Why the grants were refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("nothing to share: give at least one --folder or --write-folder")]
    Nothing,
    // The OS error is the source, printed after this by the error chain: not in the message
    // too, or it shows twice.
    #[error("cannot share {path}")]
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
    #[error(
        "cannot share {path} as {alias:?}: {reason}; rename the folder (the server knows each folder by its name)"
    )]
    Alias {
        path: PathBuf,
        alias: String,
        reason: String,
    },
    #[error("at most {max} folders can be shared at once; {given} were given")]
    TooMany { given: usize, max: usize },
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
    #[error("cannot open the toolchain folder {path}: {source}")]
    Toolchain {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the shared folder {path} was moved or replaced ({reason}); reconnect to share it again"
    )]
    Replaced { path: PathBuf, reason: String },
    #[error(
        "--downloads follows {path}, which is not a --folder or --write-folder given here; put it after the folder whose commands may use ~/Downloads"
    )]
    DownloadsNotShared { path: PathBuf },
}

impl From<ResolveError> for GrantError {
    fn from(ResolveError { path, source }: ResolveError) -> GrantError {
        GrantError::Resolve { path, source }
    }
}

/// The descriptors pinned at connect.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pins {
    /// One per shared folder, in the order of [`Grants::folders`].
    folders: Vec<PinnedDir>,
    downloads: Option<PinnedDir>,
    /// The toolchain folders of [`HOME_TOOLCHAINS`] that exist and lie in no writable grant.
    toolchains: Vec<PinnedDir>,
    /// Their credential files ([`HOME_TOOLCHAIN_SECRETS`]), denied.
    toolchain_secrets: Vec<PathBuf>,
}

/// The raw command-line grants.
#[derive(Debug, Clone, Default)]
pub struct GrantArgs {
    pub folders: Vec<PathBuf>,
    pub write_folders: Vec<PathBuf>,
    pub block: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
    /// The folders (as given in `folders` or `write_folders`) that a `--downloads` follows:
    /// only their requests get the Downloads companion.
    pub downloads: Vec<PathBuf>,
}

/// One shared folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    pub alias: String,
    /// Canonical.
    pub path: PathBuf,
    pub access: FolderAccess,
    /// `--downloads` followed it: its requests get `~/Downloads` (read/write) and
    /// `$AGENTWORKS_DOWNLOADS`.
    pub downloads: bool,
}

/// Validated grants, every path canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub folders: Vec<Folder>,
    /// `--block` paths (canonical; the missing tail of a path that does not exist yet is kept).
    pub blocked: Vec<PathBuf>,
    /// `--read-only` paths.
    pub read_only: Vec<PathBuf>,
    /// `~/Downloads`, when `--downloads` was given (after at least one folder, the ones whose
    /// [`Folder::downloads`] is set).
    pub downloads: Option<PathBuf>,
    /// The CLI's private dirs (canonical where they exist), denied to every command.
    pub private: Vec<PathBuf>,
    /// Canonical home.
    pub home: PathBuf,
    pins: Pins,
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

/// The alias the server knows `path` by: its base name (`-2`, `-3`, … for a repeated one),
/// refused here, before dialing, if the contract's alias rule would refuse it at hello.
fn alias_for(path: &Path, taken: &mut HashSet<String>) -> Result<String, GrantError> {
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "folder".to_owned());
    let mut alias = base.clone();
    let mut n = 2;
    while taken.contains(&alias) {
        alias = format!("{base}-{n}");
        n += 1;
    }
    if let Err(reason) = check_alias(&alias) {
        return Err(GrantError::Alias {
            path: path.to_owned(),
            alias,
            reason,
        });
    }
    taken.insert(alias.clone());
    Ok(alias)
}

/// Pins `canonical` (the resolution of `given`).
fn pin(given: &Path, canonical: &Path) -> Result<PinnedDir, GrantError> {
    PinnedDir::open(canonical).map_err(|source| GrantError::Open {
        path: given.to_owned(),
        source,
    })
}

/// Pins the toolchain folders under `home` that exist and lie in none of the `writable` roots;
/// returns them with their credential files (resolved now, to be denied).
fn pin_toolchains(
    home: &Path,
    writable: &[&Path],
) -> Result<(Vec<PinnedDir>, Vec<PathBuf>), GrantError> {
    let mut pinned: Vec<PinnedDir> = Vec::new();
    for dir in HOME_TOOLCHAINS {
        let path = home.join(dir);
        let canonical = match std::fs::canonicalize(&path) {
            Ok(canonical) => canonical,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(GrantError::Toolchain { path, source }),
        };
        if writable.iter().any(|w| canonical.starts_with(w))
            || pinned.iter().any(|p| p.path() == canonical)
        {
            continue;
        }
        match PinnedDir::open(&canonical) {
            Ok(dir) => pinned.push(dir),
            // A file where a toolchain folder would be is no toolchain.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
            Err(source) => return Err(GrantError::Toolchain { path, source }),
        }
    }
    let secrets = HOME_TOOLCHAIN_SECRETS
        .iter()
        .map(|secret| resolve_lenient(&home.join(secret)))
        .collect::<Result<_, _>>()?;
    Ok((pinned, secrets))
}

/// What no grant may be, contain or lie inside: the root of the filesystem, the person's home
/// and its parents, and the CLI's private dirs (credentials, state).
struct OffLimits {
    /// Canonical home.
    home: PathBuf,
    private: [(&'static str, PathBuf); 2],
}

impl OffLimits {
    fn resolve(dirs: &Dirs) -> Result<OffLimits, GrantError> {
        let home = resolve_lenient(&dirs.home)?;
        let private = [
            ("credentials", resolve_lenient(&dirs.config)?),
            ("state", resolve_lenient(&dirs.state)?),
        ];
        Ok(OffLimits { home, private })
    }

    /// Refuses `canonical` (the resolution of `given`) when it is too wide to share, or
    /// contains or lies inside a private dir.
    fn check(&self, given: &Path, canonical: &Path) -> Result<(), GrantError> {
        if canonical == Path::new("/") {
            return Err(GrantError::TooWide {
                path: given.to_owned(),
                what: "the root of the filesystem",
            });
        }
        if canonical == self.home {
            return Err(GrantError::TooWide {
                path: given.to_owned(),
                what: "your home directory",
            });
        }
        if self.home.starts_with(canonical) {
            return Err(GrantError::TooWide {
                path: given.to_owned(),
                what: "a parent of your home directory",
            });
        }
        for (what, dir) in &self.private {
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
    }
}

/// The `--folder`s then the `--write-folder`s, each opened, checked against `off_limits`,
/// refused when given twice, pinned and named; returns them with their pins, in that order.
fn grant_folders(
    args: &GrantArgs,
    off_limits: &OffLimits,
) -> Result<(Vec<Folder>, Vec<PinnedDir>), GrantError> {
    let given = args.folders.len() + args.write_folders.len();
    if given > MAX_FOLDERS {
        return Err(GrantError::TooMany {
            given,
            max: MAX_FOLDERS,
        });
    }
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
    let mut folder_pins = Vec::new();
    for (path, access) in given {
        let canonical = open_dir(path)?;
        off_limits.check(path, &canonical)?;
        if folders.iter().any(|f| f.path == canonical) {
            return Err(GrantError::Duplicate {
                path: path.to_owned(),
            });
        }
        folder_pins.push(pin(path, &canonical)?);
        folders.push(Folder {
            alias: alias_for(&canonical, &mut taken)?,
            path: canonical,
            access,
            downloads: args.downloads.contains(path),
        });
    }
    for path in &args.downloads {
        if !args.folders.contains(path) && !args.write_folders.contains(path) {
            return Err(GrantError::DownloadsNotShared { path: path.clone() });
        }
    }
    Ok((folders, folder_pins))
}

/// `~/Downloads`, opened, checked against `off_limits` and pinned, when `--downloads` was given.
fn grant_downloads(
    args: &GrantArgs,
    dirs: &Dirs,
    off_limits: &OffLimits,
) -> Result<Option<PinnedDir>, GrantError> {
    if args.downloads.is_empty() {
        return Ok(None);
    }
    let given = dirs.home.join("Downloads");
    let canonical = open_dir(&given)?;
    off_limits.check(&given, &canonical)?;
    Ok(Some(pin(&given, &canonical)?))
}

/// The folders the rule walk grants entry by entry for an exclusion at `path` inside `root`:
/// `root` and every existing folder below it on the way to `path`'s parent. Each loses file
/// creation directly in it.
fn walked_dirs(root: &Path, path: &Path) -> Vec<PathBuf> {
    let Ok(relative) = path.strip_prefix(root) else {
        return Vec::new();
    };
    let mut dirs = vec![root.to_owned()];
    let mut current = root.to_owned();
    let parents: Vec<_> = relative.parent().into_iter().flat_map(Path::iter).collect();
    for name in parents {
        current.push(name);
        if !std::fs::symlink_metadata(&current).is_ok_and(|m| m.is_dir()) {
            break;
        }
        dirs.push(current.clone());
    }
    dirs
}

/// The `flag` paths (`--block`, `--read-only`), resolved; each must lie inside a shared folder
/// or Downloads.
fn inside_shared(
    flag: &'static str,
    raw: &[PathBuf],
    folders: &[Folder],
    downloads: Option<&PinnedDir>,
) -> Result<Vec<PathBuf>, GrantError> {
    raw.iter()
        .map(|p| {
            let resolved = resolve_lenient(p)?;
            let shared = folders
                .iter()
                .map(|f| f.path.as_path())
                .chain(downloads.map(PinnedDir::path));
            if shared.clone().any(|root| resolved.starts_with(root)) {
                Ok(resolved)
            } else {
                Err(GrantError::Outside {
                    flag,
                    path: p.to_owned(),
                })
            }
        })
        .collect()
}

impl Grants {
    /// Validate the command-line grants against the person's home and the CLI's dirs.
    pub fn validate(args: &GrantArgs, dirs: &Dirs) -> Result<Grants, GrantError> {
        if args.folders.is_empty() && args.write_folders.is_empty() {
            return Err(GrantError::Nothing);
        }
        let off_limits = OffLimits::resolve(dirs)?;
        let (folders, folder_pins) = grant_folders(args, &off_limits)?;
        let downloads = grant_downloads(args, dirs, &off_limits)?;
        let blocked = inside_shared("--block", &args.block, &folders, downloads.as_ref())?;
        let read_only =
            inside_shared("--read-only", &args.read_only, &folders, downloads.as_ref())?;
        let writable: Vec<&Path> = folders
            .iter()
            .filter(|f| f.access == FolderAccess::ReadWrite)
            .map(|f| f.path.as_path())
            .chain(downloads.as_ref().map(PinnedDir::path))
            .collect();
        let OffLimits { home, private } = off_limits;
        let (toolchains, toolchain_secrets) = pin_toolchains(&home, &writable)?;
        Ok(Grants {
            folders,
            blocked,
            read_only,
            downloads: downloads.as_ref().map(|d| d.path().to_owned()),
            private: private.into_iter().map(|(_, p)| p).collect(),
            home,
            pins: Pins {
                folders: folder_pins,
                downloads,
                toolchains,
                toolchain_secrets,
            },
        })
    }

    /// Refuses a request on `folder` when it, or its Downloads companion, is no longer the
    /// directory pinned at connect.
    pub fn check_pinned(&self, folder: &Folder) -> Result<(), GrantError> {
        let check = |pin: &PinnedDir| {
            pin.check().map_err(|reason| GrantError::Replaced {
                path: pin.path().to_owned(),
                reason,
            })
        };
        check(self.folder_pin(folder)?)?;
        match self.downloads_pin(folder) {
            Some(downloads) => check(downloads),
            None => Ok(()),
        }
    }

    /// The pinned Downloads companion of `folder`: `None` unless `--downloads` followed it.
    fn downloads_pin(&self, folder: &Folder) -> Option<&PinnedDir> {
        self.pins.downloads.as_ref().filter(|_| folder.downloads)
    }

    /// `~/Downloads` when it is `folder`'s companion (`--downloads` followed it), else `None`:
    /// what its commands get as `$AGENTWORKS_DOWNLOADS` and its patches may name.
    pub fn downloads_of(&self, folder: &Folder) -> Option<&Path> {
        self.downloads_pin(folder).map(PinnedDir::path)
    }

    fn folder_pin(&self, folder: &Folder) -> Result<&PinnedDir, GrantError> {
        self.folders
            .iter()
            .position(|f| f == folder)
            .and_then(|i| self.pins.folders.get(i))
            .ok_or_else(|| GrantError::Replaced {
                path: folder.path.clone(),
                reason: "it is not one of the folders pinned at connect".to_owned(),
            })
    }

    /// The writable roots a request on `folder` gets: the folder if it is a write folder, and
    /// its Downloads companion.
    fn writable_roots<'a>(&'a self, folder: &'a Folder) -> Vec<&'a Path> {
        let own = (folder.access == FolderAccess::ReadWrite).then_some(folder.path.as_path());
        own.into_iter().chain(self.downloads_of(folder)).collect()
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
                downloads: f.downloads && self.downloads.is_some(),
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
            let linked: Vec<&str> = self
                .folders
                .iter()
                .filter(|f| f.downloads)
                .map(|f| f.alias.as_str())
                .collect();
            out.push_str(&format!(
                "  Downloads ({}): read and write for commands of {} only ($AGENTWORKS_DOWNLOADS); \
                 other folders' commands get no Downloads\n",
                d.display(),
                linked.join(", ")
            ));
            for b in self.blocked.iter().filter(|b| b.starts_with(d)) {
                out.push_str(&format!("    blocked: {}\n", b.display()));
            }
            for r in self.read_only.iter().filter(|r| r.starts_with(d)) {
                out.push_str(&format!("    read-only: {}\n", r.display()));
            }
            for f in self
                .folders
                .iter()
                .filter(|f| f.access == FolderAccess::ReadOnly && f.path.starts_with(d))
            {
                out.push_str(&format!(
                    "    read-only: {} (shared read-only as {})\n",
                    f.path.display(),
                    f.alias
                ));
            }
        }
        let toolchains: Vec<String> = self
            .pins
            .toolchains
            .iter()
            .map(|t| t.path().display().to_string())
            .collect();
        if !toolchains.is_empty() {
            out.push_str(&format!(
                "Toolchain folders commands may read and run: {}\n",
                toolchains.join(", ")
            ));
        }
        out.push_str(
            "Commands have open network access (internet, localhost, local network).\n\
             File contents and command output are sent to the server and its model.\n\
             The CLI's credentials and receipts are never reachable by commands.\n\
             These folders are held open from now on: if one is moved or replaced, requests on \
             it are refused until you reconnect.\n",
        );
        out
    }

    /// The sandbox a request on `folder` runs under, with `scratch` as its private scratch dir:
    /// the folder, its Downloads companion and the toolchains through their pinned descriptors; every
    /// `--block` path, the CLI's private dirs and the toolchains' credentials denied; inside
    /// each writable root, its `--read-only` paths and every read-only folder shared inside it
    /// (whichever folder the request is on) read-only.
    pub fn policy(&self, folder: &Folder, scratch: &Path) -> Result<SandboxPolicy, GrantError> {
        let access = match folder.access {
            FolderAccess::ReadOnly => PinnedAccess::ReadOnly,
            FolderAccess::ReadWrite => PinnedAccess::ReadWrite,
        };
        let mut pinned = vec![self.folder_pin(folder)?.grant(access)];
        if let Some(downloads) = self.downloads_pin(folder) {
            pinned.push(downloads.grant(PinnedAccess::ReadWrite));
        }
        pinned.extend(
            self.pins
                .toolchains
                .iter()
                .map(|t| t.grant(PinnedAccess::ReadOnly)),
        );
        let writable = self.writable_roots(folder);
        let within = |path: &Path| writable.iter().any(|w| path != *w && path.starts_with(w));
        let mut read_only_within: Vec<PathBuf> = self
            .read_only
            .iter()
            .filter(|r| within(r))
            .cloned()
            .collect();
        read_only_within.extend(
            self.folders
                .iter()
                .filter(|o| o.access == FolderAccess::ReadOnly && within(&o.path))
                .map(|o| o.path.clone()),
        );
        let mut denied = self.private.clone();
        denied.extend(self.pins.toolchain_secrets.iter().cloned());
        Ok(SandboxPolicy {
            pinned,
            read_write: Vec::new(),
            read_only: Vec::new(),
            blocked: self.blocked.clone(),
            read_only_within,
            denied,
            // The toolchains are pinned.
            read_only_if_present: Vec::new(),
            scratch: scratch.to_owned(),
            cwd: folder.path.clone(),
            limits: Default::default(),
            // The executor decides, from its connect-time probe.
            overmount_exclusions: false,
            // No terminal device: the laptop's rule.
            private_terminals: false,
        })
    }

    /// The text printed after the permissions: in which shared folders a command cannot create
    /// new entries directly, and why, given how this machine enforces exclusions. Empty when
    /// every folder keeps file creation.
    pub fn file_creation_text(&self, mechanism: &ExclusionMechanism) -> String {
        let why_walk = match mechanism {
            ExclusionMechanism::Profile => return String::new(),
            ExclusionMechanism::Overmount => None,
            ExclusionMechanism::Walk(reason) => Some(reason.as_str()),
        };
        let mut writable: Vec<&Path> = self
            .folders
            .iter()
            .filter(|f| f.access == FolderAccess::ReadWrite)
            .map(|f| f.path.as_path())
            .collect();
        if self.folders.iter().any(|f| f.downloads) {
            writable.extend(self.downloads.as_deref());
        }
        let nested_read_only = self
            .folders
            .iter()
            .filter(|f| f.access == FolderAccess::ReadOnly)
            .map(|f| ("--folder", &f.path));
        let exclusions: Vec<(&str, &PathBuf)> = self
            .blocked
            .iter()
            .map(|p| ("--block", p))
            .chain(self.read_only.iter().map(|p| ("--read-only", p)))
            .chain(nested_read_only)
            .collect();
        let mut lines = Vec::new();
        for root in writable {
            for (flag, path) in &exclusions {
                if *path == root || !path.starts_with(root) {
                    continue;
                }
                let coverable = std::fs::symlink_metadata(path)
                    .is_ok_and(|m| m.file_type().is_file() || m.file_type().is_dir());
                let why = match why_walk {
                    Some(reason) => format!(
                        "this machine does not let the sandbox make a user and mount namespace \
                         ({reason}), so Landlock, which can only grant, carves {flag} {} out by \
                         granting every other entry one by one",
                        path.display()
                    ),
                    None if coverable => continue,
                    None => format!(
                        "{flag} {} is not a file or folder now, and only an existing one can be \
                         covered: create it (even empty) to lift this",
                        path.display()
                    ),
                };
                let dirs: Vec<String> = walked_dirs(root, path)
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                lines.push(format!("  {}: {why}\n", dirs.join(", ")));
            }
        }
        if lines.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "Commands cannot create new files or folders directly in these folders (inside their \
             subfolders they can):\n",
        );
        out.extend(lines);
        out
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

    /// The guard patches inside the Downloads companion are checked against (`None` without
    /// `--downloads`): built as [`Grants::guard`] builds a folder's, so the `--block` and
    /// `--read-only` paths inside Downloads, and every read-only folder shared inside it, stay
    /// out of reach of a patch that names an absolute Downloads path.
    pub fn downloads_guard(&self) -> Option<Guard> {
        let downloads = self.downloads.as_ref()?;
        Some(self.guard(&Folder {
            alias: String::new(),
            path: downloads.clone(),
            access: FolderAccess::ReadWrite,
            downloads: false,
        }))
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
    fn folders_are_named_by_the_contracts_alias_rule_before_dialing() {
        let (dir, dirs) = setup();
        let home = dir
            .path()
            .canonicalize()
            .expect("canonical")
            .join("home/me");
        for name in ["My Notes", "colon:name", " lead"] {
            std::fs::create_dir_all(home.join(name)).expect("mkdir");
        }
        let ok = Grants::validate(&args(&[], &[&home.join("My Notes")]), &dirs).expect("valid");
        assert_eq!(ok.folders[0].alias, "My Notes");
        for (name, reason) in [("colon:name", "':'"), (" lead", "space")] {
            let error = Grants::validate(&args(&[&home.join(name)], &[]), &dirs)
                .expect_err(name)
                .to_string();
            assert!(
                error.contains(reason) && error.contains("rename the folder"),
                "{name}: {error}"
            );
        }
        let many: Vec<PathBuf> = (0..=MAX_FOLDERS)
            .map(|n| {
                let path = home.join(format!("f{n}"));
                std::fs::create_dir_all(&path).expect("mkdir");
                path
            })
            .collect();
        let many: Vec<&Path> = many.iter().map(PathBuf::as_path).collect();
        assert!(matches!(
            Grants::validate(&args(&many, &[]), &dirs),
            Err(GrantError::TooMany { .. })
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
        let policy = grants.policy(write, &root.join("scratch")).expect("policy");
        let pinned: Vec<_> = policy
            .pinned
            .iter()
            .map(|p| (p.path.clone(), p.access))
            .collect();
        assert_eq!(
            pinned,
            vec![(a.clone(), PinnedAccess::ReadWrite)],
            "other folders are not reachable"
        );
        assert!(policy.read_write.is_empty() && policy.read_only.is_empty());
        assert_eq!(
            policy.read_only_if_present,
            Vec::<PathBuf>::new(),
            "toolchains are pinned, not resolved by path"
        );
        assert_eq!(policy.read_only_within, vec![a.join("sub")]);
        assert_eq!(policy.blocked, vec![a.join("secret")]);
        for private in [&dirs.config, &dirs.state] {
            assert!(policy.denied.contains(private), "{}", private.display());
        }
        assert!(
            policy
                .denied
                .contains(&dirs.home.join(".cargo/credentials.toml"))
        );
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
