//! The private runtime of a (user, project, chat, provider, mode): the directory a coding CLI
//! runs in, as DESIGN.md "The runtime" describes.
//!
//! `<runtimes_root>/<sha256(user, project, chat, provider, mode)[:32]>/` (0700) holds `home/`
//! (the CLI's HOME, with the XDG directories under it), `tmp/`, the generated files (the CLI's
//! config and its instruction file, rewritten every turn) and, in server mode, the `project`
//! link to the project's folder. Owns making, rewriting and removing that directory, the
//! guidance text and the session key.
//!
//! Must never: follow a symlink inside a runtime (the CLI can write its runtime between turns
//! and plant links anywhere in it; runnerd runs as the documents' user, so following one would
//! write or delete with that authority), delete or replace an existing `project` that is not
//! exactly runnerd's link (refused with [`RuntimeError::Occupied`]; never a fallback to a shared
//! cwd), delete anything a `project` link points at, or write generated files into the project.
//!
//! Inside a runtime, a symlink or a file where runnerd needs a directory (`home/`, `tmp/`, the
//! XDG directories, a generated file's folder) is the CLI's doing: it is unlinked (the entry
//! itself; `unlinkat` without `AT_REMOVEDIR` never follows a link and cannot remove a
//! directory) and a fresh directory made in its place. `project` is the one exception: refused,
//! never touched.

use std::ffi::{CStr, OsStr};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use agentworks_contract::runnerd::Mode;
use agentworks_core::guard::PROTECTED_FILE_NAMES;
use rustix::fs::{AtFlags, FileType, Mode as FileMode, OFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

/// The name of the link to the project's folder inside a runtime.
pub const PROJECT_LINK: &str = "project";

/// The XDG directories made under `home/`, with the variable that names each one.
const XDG_DIRS: [(&str, &str); 4] = [
    ("XDG_CONFIG_HOME", ".config"),
    ("XDG_CACHE_HOME", ".cache"),
    ("XDG_DATA_HOME", ".local/share"),
    ("XDG_STATE_HOME", ".local/state"),
];

/// How deep [`remove`] descends; the CLI could nest folders without end, and each level holds
/// a descriptor.
const MAX_REMOVE_DEPTH: usize = 256;

/// Why a runtime could not be made, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtimes folder could not be made private (created 0700, no symlink in its place).
    #[error("cannot prepare the runtimes folder: {0}")]
    Root(#[from] agentworks_daemon::layout::LayoutError),
    /// The project's folder must be named by an absolute path: a relative link would resolve
    /// inside the runtime.
    #[error("the project folder {0} is not an absolute path")]
    RelativeTarget(PathBuf),
    /// The runtime's `project` is something else than runnerd's link to this project.
    #[error(
        "{path} is {found}, not runnerd's link to the project: refusing to run there \
         (nothing was changed; move it away)"
    )]
    Occupied { path: PathBuf, found: String },
    /// A generated file's path must be plain, relative and outside `project`.
    #[error(
        "{path} is not a plain relative path inside the runtime (nor may it be under project/)"
    )]
    BadRelative { path: PathBuf },
    /// Creating or opening one of the runtime's directories failed.
    #[error("cannot create or open the runtime directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Reading or creating the `project` link failed.
    #[error("cannot make the project link {path}: {source}")]
    Link {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Writing a generated file failed.
    #[error("cannot write the generated file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Removing part of a runtime failed.
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A runtime nests folders deeper than runnerd descends.
    #[error("{path} nests folders deeper than {MAX_REMOVE_DEPTH} levels: remove it by hand")]
    TooDeep { path: PathBuf },
}

/// What a runtime belongs to; every field is part of its directory's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeKey<'a> {
    pub user_id: &'a str,
    pub project: &'a str,
    pub chat_id: &'a str,
    pub provider: &'a str,
    pub mode: Mode,
    /// The chat is bound to a laptop folder: a runtime of its own, without a `project` link
    /// (a chat's server-mode runtime keeps its link; neither is ever reused for the other).
    pub laptop: bool,
}

impl RuntimeKey<'_> {
    /// The runtime's directory name: sha256 over the length-prefixed fields, hex, first 32
    /// characters. Length prefixes keep `("ab", "c")` and `("a", "bc")` apart.
    pub fn dir_name(&self) -> String {
        let mut hasher = Sha256::new();
        for field in [
            self.user_id,
            self.project,
            self.chat_id,
            self.provider,
            self.mode.as_str(),
        ] {
            hash_field(&mut hasher, field.as_bytes());
        }
        // Only for a laptop turn, so every server-mode runtime keeps the name it had.
        if self.laptop {
            hash_field(&mut hasher, b"laptop");
        }
        let mut name = hex::encode(hasher.finalize());
        name.truncate(32);
        name
    }
}

/// Feeds one field into a hash, prefixed by its length (8 bytes, big-endian).
fn hash_field(hasher: &mut Sha256, field: &[u8]) {
    hasher.update((field.len() as u64).to_be_bytes());
    hasher.update(field);
}

/// A prepared runtime: where its parts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// The runtime itself, the CLI's cwd.
    pub dir: PathBuf,
    /// The CLI's HOME; the XDG directories are under it ([`Runtime::environment`]).
    pub home: PathBuf,
    /// The CLI's TMPDIR.
    pub tmp: PathBuf,
    /// `<dir>/project`: the link to the project's folder in server mode; absent for a chat
    /// bound to a laptop.
    pub project_link: PathBuf,
}

impl Runtime {
    /// The variables that point the CLI at its private directories: `HOME`, the XDG
    /// directories and `TMPDIR`.
    pub fn environment(&self) -> Vec<(&'static str, PathBuf)> {
        let mut vars = vec![("HOME", self.home.clone()), ("TMPDIR", self.tmp.clone())];
        vars.extend(
            XDG_DIRS
                .iter()
                .map(|(var, relative)| (*var, self.home.join(relative))),
        );
        vars
    }
}

/// Creates `<runtimes_root>/<dir_name>` (0700; `runtimes_root` is created 0700 if missing),
/// `home/` with the XDG directories under it, `tmp/` (each 0700), and the `project` link to
/// `project_target` (server mode). `None` is a chat bound to a laptop: no link at all.
///
/// Refuses ([`RuntimeError::Occupied`]) an existing `project` that is a regular file, a
/// directory, or a link to anything but `project_target`, and, for a laptop-bound chat, any
/// `project` at all: never deletes one, never falls back. An existing link to the same target
/// is kept.
///
/// `runtimes_root` is made private (0700, an existing one included; a symlink there is refused).
/// Nothing inside the runtime is followed: every step is an `*at` call on a descriptor of the
/// directory above, opened with `O_NOFOLLOW`. A symlink or a file the CLI left where `home/`,
/// `tmp/` or an XDG directory belongs is unlinked (never followed) and replaced by a fresh,
/// empty directory; what the link pointed at is untouched.
pub fn prepare(
    runtimes_root: &Path,
    key: &RuntimeKey,
    project_target: Option<&Path>,
) -> Result<Runtime, RuntimeError> {
    // Checked before anything is made: a relative target would name a path inside the runtime.
    if let Some(target) = project_target
        && !target.is_absolute()
    {
        return Err(RuntimeError::RelativeTarget(target.to_path_buf()));
    }
    agentworks_daemon::layout::ensure_private_dir(runtimes_root, 0o700)?;
    let root_fd = open_dir(runtimes_root)?;

    let name = key.dir_name();
    let dir = runtimes_root.join(&name);
    let dir_fd = ensure_dir_at(root_fd.as_fd(), OsStr::new(&name), &dir)?;

    let home = dir.join("home");
    let home_fd = ensure_dir_at(dir_fd.as_fd(), OsStr::new("home"), &home)?;
    for (_, relative) in XDG_DIRS {
        ensure_dirs_at(home_fd.as_fd(), Path::new(relative), &home)?;
    }
    let tmp = dir.join("tmp");
    ensure_dir_at(dir_fd.as_fd(), OsStr::new("tmp"), &tmp)?;

    let project_link = dir.join(PROJECT_LINK);
    ensure_project_link(dir_fd.as_fd(), project_target, &project_link)?;

    Ok(Runtime {
        dir,
        home,
        tmp,
        project_link,
    })
}

/// Opens a directory runnerd owns the path to, refusing a symlink at its last component.
fn open_dir(path: &Path) -> Result<OwnedFd, RuntimeError> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        FileMode::empty(),
    )
    .map_err(|errno| RuntimeError::Dir {
        path: path.to_path_buf(),
        source: errno.into(),
    })
}

/// Makes `relative` (plain components) under `parent` with [`ensure_dir_at`] at each level.
fn ensure_dirs_at(
    parent: BorrowedFd<'_>,
    relative: &Path,
    parent_path: &Path,
) -> Result<OwnedFd, RuntimeError> {
    let mut path = parent_path.to_path_buf();
    let mut current: Option<OwnedFd> = None;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(RuntimeError::BadRelative {
                path: relative.to_path_buf(),
            });
        };
        path.push(name);
        let at = current.as_ref().map_or(parent, |fd| fd.as_fd());
        current = Some(ensure_dir_at(at, name, &path)?);
    }
    current.ok_or_else(|| RuntimeError::BadRelative {
        path: relative.to_path_buf(),
    })
}

/// Makes the directory `name` in `parent` (0700) if missing and opens it without following a
/// link; a symlink or a non-directory in its place is unlinked and the directory made afresh.
fn ensure_dir_at(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
) -> Result<OwnedFd, RuntimeError> {
    let dir_error = |errno: Errno| RuntimeError::Dir {
        path: path.to_path_buf(),
        source: errno.into(),
    };
    // Two rounds: the first may find something planted and unlink it.
    for _ in 0..2 {
        match rustix::fs::mkdirat(parent, name, FileMode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(errno) => return Err(dir_error(errno)),
        }
        match rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            FileMode::empty(),
        ) {
            Ok(fd) => {
                // An existing directory keeps whatever mode the CLI gave it otherwise.
                rustix::fs::fchmod(&fd, FileMode::from_raw_mode(0o700)).map_err(dir_error)?;
                return Ok(fd);
            }
            // O_NOFOLLOW|O_DIRECTORY on a symlink fails with ENOTDIR (or ELOOP): not ours.
            Err(Errno::LOOP | Errno::NOTDIR) => {
                match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(errno) => return Err(dir_error(errno)),
                }
            }
            Err(errno) => return Err(dir_error(errno)),
        }
    }
    Err(RuntimeError::Dir {
        path: path.to_path_buf(),
        source: std::io::Error::other("it was replaced again while runnerd made it"),
    })
}

/// Keeps an existing link to `target`, makes a missing one, refuses anything else.
fn ensure_project_link(
    dir_fd: BorrowedFd<'_>,
    target: Option<&Path>,
    link: &Path,
) -> Result<(), RuntimeError> {
    let link_error = |errno: Errno| RuntimeError::Link {
        path: link.to_path_buf(),
        source: errno.into(),
    };
    // Two rounds: a link made by someone else between the check and symlinkat is checked again.
    for _ in 0..2 {
        match rustix::fs::readlinkat(dir_fd, PROJECT_LINK, Vec::new()) {
            Ok(found) => {
                let found = Path::new(OsStr::from_bytes(found.as_bytes()));
                if target == Some(found) {
                    return Ok(());
                }
                return Err(RuntimeError::Occupied {
                    path: link.to_path_buf(),
                    found: format!("a link to {}", found.display()),
                });
            }
            Err(Errno::NOENT) => {}
            // EINVAL: it exists and is not a symlink.
            Err(Errno::INVAL) => {
                let found =
                    match rustix::fs::statat(dir_fd, PROJECT_LINK, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(stat) => describe(FileType::from_raw_mode(stat.st_mode)),
                        Err(errno) => return Err(link_error(errno)),
                    };
                return Err(RuntimeError::Occupied {
                    path: link.to_path_buf(),
                    found: found.to_owned(),
                });
            }
            Err(errno) => return Err(link_error(errno)),
        }
        let Some(target) = target else {
            return Ok(());
        };
        match rustix::fs::symlinkat(target, dir_fd, PROJECT_LINK) {
            Ok(()) => return Ok(()),
            Err(Errno::EXIST) => continue,
            Err(errno) => return Err(link_error(errno)),
        }
    }
    Err(RuntimeError::Link {
        path: link.to_path_buf(),
        source: std::io::Error::other("it kept changing while runnerd made it"),
    })
}

/// A person's words for what was found where a link was expected.
fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a link",
        FileType::Fifo => "a fifo",
        FileType::Socket => "a socket",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Unknown => "something unknown",
    }
}

/// The generated instruction file (AGENTS.md for Codex): the path rule, the mode with what it
/// allows, and the real target path.
///
/// `write_paths`, `blocked` and `read_only` are the resolved guard's project-relative paths
/// (Builder mode lists them; Run mode needs none of them: nothing is writable).
pub fn guidance(
    mode: Mode,
    project_target: &Path,
    write_paths: &[String],
    blocked: &[String],
    read_only: &[String],
) -> String {
    let mut text = String::new();
    text.push_str("# Working on this agentworks project\n\n");
    text.push_str(
        "This file is generated by agentworks for every turn; changes to it are overwritten.\n\n",
    );
    text.push_str("## Paths\n\n");
    text.push_str(&format!(
        "Your working directory is your private runtime, not the project. The project is the \
         folder `project/` in it (the real folder is `{}`).\n\n",
        project_target.display()
    ));
    text.push_str(
        "- Your own file tools (read, edit, write): use `project/<path>`, e.g. \
         `project/README.md`.\n\
         - Shell commands: start with `cd project && …`, e.g. `cd project && ls`.\n\
         - The agentworks bridge tools (`execute_shell_command`, `diff_patch_workspace_file`) \
         take paths relative to the project: `README.md`, not `project/README.md`.\n\n",
    );
    match mode {
        Mode::Run => {
            text.push_str("## Mode: Run (read-only)\n\n");
            text.push_str(
                "The project is read-only in this chat: you may read it and run commands, but \
                 every write to it will fail. Do not try to work around that; say what you would \
                 change instead.\n",
            );
        }
        Mode::Builder => {
            text.push_str("## Mode: Builder\n\n");
            if write_paths.is_empty() {
                text.push_str(
                    "You may not write anywhere in the project: you have no write grants. Writes \
                     will fail.\n",
                );
            } else {
                text.push_str(
                    "You may write in the project only within these paths (project-relative); \
                     writes anywhere else will fail:\n\n",
                );
                push_list(&mut text, write_paths);
            }
            if !blocked.is_empty() {
                text.push_str("\nBlocked: neither readable nor writable:\n\n");
                push_list(&mut text, blocked);
            }
            if !read_only.is_empty() {
                text.push_str("\nRead-only: readable, never writable:\n\n");
                push_list(&mut text, read_only);
            }
            text.push_str(&format!(
                "\nProtected files, never writable anywhere in the project: {}.\n",
                PROTECTED_FILE_NAMES
                    .iter()
                    .map(|name| format!("`{name}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    text
}

/// The generated instruction file of a chat bound to a laptop folder: the CLI's own shell and
/// file tools are off, and the bridge tools work in the person's folder on their computer.
pub fn laptop_guidance(writable: bool) -> String {
    let mut text = String::new();
    text.push_str(
        "# Working in a folder on the person's computer

",
    );
    text.push_str(
        "This file is generated by agentworks for every turn; changes to it are overwritten.\n\n",
    );
    text.push_str(
        "This chat works in a folder the person shared from their own computer, not on this \
         server. Your own shell and file tools are switched off: the files you could reach \
         with them are not the person's. Work only through the agentworks bridge tools:\n\n\
         - `execute_shell_command` runs a command in that folder (its working directory), on \
         their computer.\n",
    );
    if writable {
        text.push_str(
            "- `diff_patch_workspace_file` applies a unified diff to one file of that folder; \
             `filepath` is relative to the folder.\n",
        );
    } else {
        text.push_str(
            "\nThe folder is shared read-only: there is no patch tool, and commands cannot \
             change it. Say what you would change instead.\n",
        );
    }
    text
}

fn push_list(text: &mut String, items: &[String]) {
    for item in items {
        text.push_str(&format!("- `{item}`\n"));
    }
}

/// Writes a generated file into the runtime (rewritten every turn): a temporary file made with
/// `O_EXCL|O_NOFOLLOW`, mode 0600, renamed over `relative`. The rename replaces whatever entry is
/// there: a symlink the CLI planted is replaced, never followed; a directory in its place is
/// removed first (without following anything in it). Missing folders on the way are made 0700
/// (a link or file in their place replaced as in [`prepare`]). Returns the sha256 hex of
/// `contents`.
///
/// `relative` must be plain components and must not start with `project`: user-owned
/// instructions in the project are never a destination.
pub fn write_generated(
    dir: &Path,
    relative: &Path,
    contents: &str,
) -> Result<String, RuntimeError> {
    let bad = || RuntimeError::BadRelative {
        path: relative.to_path_buf(),
    };
    let mut components = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => components.push(name),
            _ => return Err(bad()),
        }
    }
    let Some((file_name, folders)) = components.split_last() else {
        return Err(bad());
    };
    if components.first() == Some(&OsStr::new(PROJECT_LINK)) {
        return Err(bad());
    }
    let path = dir.join(relative);
    let write_error = |source: std::io::Error| RuntimeError::Write {
        path: path.clone(),
        source,
    };

    let dir_fd = open_dir(dir)?;
    let parent_fd = if folders.is_empty() {
        dir_fd
    } else {
        ensure_dirs_at(dir_fd.as_fd(), &folders.iter().collect::<PathBuf>(), dir)?
    };

    let mut temp_name = OsStr::new(".").to_os_string();
    temp_name.push(file_name);
    temp_name.push(format!(".{}.tmp", hex::encode(rand::random::<[u8; 8]>())));
    let temp = rustix::fs::openat(
        &parent_fd,
        &temp_name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        FileMode::from_raw_mode(0o600),
    )
    .map_err(|errno| write_error(errno.into()))?;
    let filled = (|| -> std::io::Result<()> {
        // The umask may have taken bits away from the create mode; 0600 exactly.
        rustix::fs::fchmod(&temp, FileMode::from_raw_mode(0o600))?;
        let mut file = std::fs::File::from(temp);
        file.write_all(contents.as_bytes())?;
        // No fsync: the file is rewritten before every turn, so a torn one after a power cut
        // is rewritten before anything reads it.
        Ok(())
    })();
    let renamed = filled.and_then(|()| {
        match rustix::fs::renameat(&parent_fd, &temp_name, &parent_fd, *file_name) {
            // A directory where the file belongs (EISDIR, or ENOTEMPTY/EEXIST from some
            // filesystems): remove it without following anything, then rename again.
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                remove_tree_at(parent_fd.as_fd(), file_name, &path, 0)
                    .map_err(std::io::Error::other)?;
                rustix::fs::renameat(&parent_fd, &temp_name, &parent_fd, *file_name)
                    .map_err(Into::into)
            }
            other => other.map_err(Into::into),
        }
    });
    if let Err(source) = renamed {
        // Best effort: a leftover temporary file is only litter in the runtime.
        let _ = rustix::fs::unlinkat(&parent_fd, &temp_name, AtFlags::empty());
        return Err(write_error(source));
    }
    Ok(hex::encode(Sha256::digest(contents.as_bytes())))
}

/// The session key: sha256 (hex) over the runtime's directory name, the provider, the mode and
/// the hashes of the generated files, each length-prefixed. A CLI session recorded under one key
/// is never resumed under another: another chat, provider or mode, or changed guidance.
pub fn session_key(key: &RuntimeKey, generated_hashes: &[String]) -> String {
    let mut hasher = Sha256::new();
    hash_field(&mut hasher, key.dir_name().as_bytes());
    hash_field(&mut hasher, key.provider.as_bytes());
    hash_field(&mut hasher, key.mode.as_str().as_bytes());
    hasher.update((generated_hashes.len() as u64).to_be_bytes());
    for hash in generated_hashes {
        hash_field(&mut hasher, hash.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Removes a runtime: everything in it, never what `project` (or any other link in it) points
/// at: links are unlinked, not followed. A missing runtime is fine.
///
/// Folders the CLI made unreadable or read-only are made 0700 first (a Go module cache is
/// 0555), through descriptors, so the removal does not stop there.
pub fn remove(dir: &Path) -> Result<(), RuntimeError> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(RuntimeError::Remove {
            path: dir.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_fd = match open_dir(parent) {
        Ok(fd) => fd,
        Err(RuntimeError::Dir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    remove_tree_at(parent_fd.as_fd(), name, dir, 0)
}

/// Removes the entry `name` in `parent`: a directory with everything in it, anything else
/// (a link included) by unlinking the entry itself.
fn remove_tree_at(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    path: &Path,
    depth: usize,
) -> Result<(), RuntimeError> {
    let remove_error = |errno: Errno| RuntimeError::Remove {
        path: path.to_path_buf(),
        source: errno.into(),
    };
    let fd = match open_dir_for_removal(parent, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        // Not a directory (a link, a file, a socket …): unlink the entry itself.
        Err(Errno::LOOP | Errno::NOTDIR) => {
            return match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(errno) => Err(remove_error(errno)),
            };
        }
        Err(errno) => return Err(remove_error(errno)),
    };
    if depth >= MAX_REMOVE_DEPTH {
        return Err(RuntimeError::TooDeep {
            path: path.to_path_buf(),
        });
    }
    // Unlinking inside needs write and search permission on the directory.
    rustix::fs::fchmod(&fd, FileMode::from_raw_mode(0o700)).map_err(remove_error)?;
    // Names first, removal after: the listing is not disturbed by the removals.
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd).map_err(remove_error)? {
        let entry = entry.map_err(remove_error)?;
        let entry_name: &CStr = entry.file_name();
        if entry_name != c"." && entry_name != c".." {
            names.push(OsStr::from_bytes(entry_name.to_bytes()).to_os_string());
        }
    }
    for entry_name in names {
        remove_tree_at(fd.as_fd(), &entry_name, &path.join(&entry_name), depth + 1)?;
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(errno) => Err(remove_error(errno)),
    }
}

/// Opens a directory entry without following a link. One the CLI made unreadable (mode 000)
/// is opened as `O_PATH` (still no-follow), made 0700 through `/proc/self/fd` (the descriptor,
/// not the name, so nothing swapped in meanwhile is changed), then opened again.
fn open_dir_for_removal(parent: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(parent, name, flags, FileMode::empty()) {
        Err(Errno::ACCESS) => {
            let pinned = rustix::fs::openat(
                parent,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                FileMode::empty(),
            )?;
            let through = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&pinned));
            rustix::fs::chmod(through.as_str(), FileMode::from_raw_mode(0o700))?;
            // Opened through the pinned descriptor, so it is the same directory.
            rustix::fs::openat(&pinned, ".", flags, FileMode::empty())
        }
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn key() -> RuntimeKey<'static> {
        RuntimeKey {
            user_id: "u1",
            project: "alpha",
            chat_id: "c1",
            provider: "codex",
            mode: Mode::Run,
            laptop: false,
        }
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// A temp dir with `runtimes/` (not made yet) and a project folder holding one file.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let runtimes = tmp.path().join("state/runner/runtimes");
        let project = tmp.path().join("docs/alpha");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("README.md"), "hello").unwrap();
        (tmp, runtimes, project)
    }

    #[test]
    fn dir_names_are_stable_and_differ_per_field() {
        let base = key();
        let name = base.dir_name();
        assert_eq!(name.len(), 32);
        assert!(name.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(name, key().dir_name(), "stable");
        let others = [
            RuntimeKey {
                user_id: "u2",
                ..base
            },
            RuntimeKey {
                project: "beta",
                ..base
            },
            RuntimeKey {
                chat_id: "c2",
                ..base
            },
            RuntimeKey {
                provider: "codex2",
                ..base
            },
            RuntimeKey {
                mode: Mode::Builder,
                ..base
            },
            RuntimeKey {
                laptop: true,
                ..base
            },
            // The length prefixes keep shifted boundaries apart.
            RuntimeKey {
                user_id: "u1a",
                project: "lpha",
                ..base
            },
        ];
        let mut seen = std::collections::BTreeSet::from([name]);
        for other in others {
            assert!(seen.insert(other.dir_name()), "{other:?} collides");
        }
    }

    #[test]
    fn prepare_makes_private_dirs_and_the_link_and_keeps_it() {
        let (_tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        assert_eq!(runtime.dir, runtimes.join(key().dir_name()));
        for dir in [&runtimes, &runtime.dir, &runtime.home, &runtime.tmp] {
            assert!(std::fs::symlink_metadata(dir).unwrap().is_dir(), "{dir:?}");
            assert_eq!(mode_of(dir), 0o700, "{dir:?}");
        }
        for (_, path) in runtime.environment() {
            assert!(
                std::fs::symlink_metadata(&path).unwrap().is_dir(),
                "{path:?}"
            );
        }
        assert_eq!(std::fs::read_link(&runtime.project_link).unwrap(), project);
        assert_eq!(
            std::fs::read_to_string(runtime.project_link.join("README.md")).unwrap(),
            "hello"
        );

        // A second prepare keeps the link and what the CLI left in its home.
        std::fs::write(runtime.home.join("session"), "s").unwrap();
        std::fs::set_permissions(&runtime.home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let again = prepare(&runtimes, &key(), Some(&project)).unwrap();
        assert_eq!(again, runtime);
        assert_eq!(std::fs::read_link(&again.project_link).unwrap(), project);
        assert_eq!(
            std::fs::read_to_string(again.home.join("session")).unwrap(),
            "s"
        );
        assert_eq!(mode_of(&again.home), 0o700);
    }

    #[test]
    fn a_laptop_bound_runtime_has_no_link() {
        let (_tmp, runtimes, _project) = setup();
        let runtime = prepare(&runtimes, &key(), None).unwrap();
        assert!(std::fs::symlink_metadata(&runtime.project_link).is_err());
        assert!(runtime.home.is_dir());
    }

    #[test]
    fn a_relative_target_is_refused_before_anything_is_made() {
        let (_tmp, runtimes, _project) = setup();
        let err = prepare(&runtimes, &key(), Some(Path::new("docs/alpha"))).unwrap_err();
        assert!(matches!(err, RuntimeError::RelativeTarget(_)), "{err}");
        assert!(!runtimes.exists());
    }

    /// Makes the runtime's directory and puts `plant` at `project`, then prepares.
    fn prepare_with_planted(
        plant: impl FnOnce(&Path),
        target: Option<&Path>,
        runtimes: &Path,
    ) -> (PathBuf, RuntimeError) {
        let dir = runtimes.join(key().dir_name());
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(PROJECT_LINK);
        plant(&link);
        let err = prepare(runtimes, &key(), target).unwrap_err();
        (link, err)
    }

    #[test]
    fn an_occupied_project_is_refused_and_left_as_it_was() {
        // A regular file.
        let (_tmp, runtimes, project) = setup();
        let (link, err) = prepare_with_planted(
            |p| std::fs::write(p, "mine").unwrap(),
            Some(&project),
            &runtimes,
        );
        match &err {
            RuntimeError::Occupied { path, found } => {
                assert_eq!(path, &link);
                assert_eq!(found, "a regular file");
            }
            other => panic!("{other}"),
        }
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "mine");

        // A directory with a file inside.
        let (_tmp, runtimes, project) = setup();
        let (link, err) = prepare_with_planted(
            |p| {
                std::fs::create_dir(p).unwrap();
                std::fs::write(p.join("inside"), "kept").unwrap();
            },
            Some(&project),
            &runtimes,
        );
        assert!(
            matches!(&err, RuntimeError::Occupied { found, .. } if found == "a directory"),
            "{err}"
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().is_dir());
        assert_eq!(
            std::fs::read_to_string(link.join("inside")).unwrap(),
            "kept"
        );

        // A link to another folder.
        let (tmp, runtimes, project) = setup();
        let elsewhere = tmp.path().join("docs/beta");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let (link, err) = prepare_with_planted(
            |p| symlink(&elsewhere, p).unwrap(),
            Some(&project),
            &runtimes,
        );
        assert!(
            matches!(&err, RuntimeError::Occupied { found, .. } if found.contains("docs/beta")),
            "{err}"
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), elsewhere);

        // Any `project` in a laptop-bound runtime, even a link to a project.
        let (_tmp, runtimes, project) = setup();
        let (link, err) = prepare_with_planted(|p| symlink(&project, p).unwrap(), None, &runtimes);
        assert!(matches!(&err, RuntimeError::Occupied { .. }), "{err}");
        assert_eq!(std::fs::read_link(&link).unwrap(), project);
    }

    #[test]
    fn planted_links_at_home_and_tmp_are_replaced_not_followed() {
        let (tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        // The CLI, between turns, points home/ at another folder and turns tmp/ into a file.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(elsewhere.join("precious"), "p").unwrap();
        std::fs::remove_dir_all(&runtime.home).unwrap();
        symlink(&elsewhere, &runtime.home).unwrap();
        std::fs::remove_dir_all(&runtime.tmp).unwrap();
        std::fs::write(&runtime.tmp, "junk").unwrap();

        let again = prepare(&runtimes, &key(), Some(&project)).unwrap();
        let home = std::fs::symlink_metadata(&again.home).unwrap();
        assert!(home.is_dir() && !home.file_type().is_symlink());
        assert!(std::fs::symlink_metadata(&again.tmp).unwrap().is_dir());
        assert!(again.home.join(".config").is_dir());
        // Nothing was made, changed or removed where the link pointed.
        assert_eq!(mode_of(&elsewhere), 0o755);
        let inside: Vec<_> = std::fs::read_dir(&elsewhere)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(inside, vec![OsStr::new("precious").to_os_string()]);
    }

    #[test]
    fn remove_leaves_the_target_intact() {
        let (_tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        write_generated(&runtime.dir, Path::new("AGENTS.md"), "guidance").unwrap();
        // What a CLI might leave: nested folders, one unreadable, one read-only (a Go cache).
        let cache = runtime.home.join(".cache/go/mod");
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::write(cache.join("m.go"), "package m").unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o555)).unwrap();
        let locked = runtime.tmp.join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("f"), "f").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        symlink(&project, runtime.tmp.join("another-link")).unwrap();

        // As root, the permission bits would not stop anything: drop the capabilities that
        // bypass them, in a thread of its own (capabilities are per thread), so the removal
        // meets the unreadable folder as runnerd's user would.
        let dir = runtime.dir.clone();
        std::thread::spawn(move || {
            for cap in [
                caps::Capability::CAP_DAC_OVERRIDE,
                caps::Capability::CAP_DAC_READ_SEARCH,
            ] {
                caps::drop(None, caps::CapSet::Effective, cap).unwrap();
            }
            assert!(
                std::fs::read_dir(&locked).is_err(),
                "the folder is unreadable"
            );
            remove(&dir)
        })
        .join()
        .unwrap()
        .unwrap();
        assert!(std::fs::symlink_metadata(&runtime.dir).is_err());
        assert_eq!(
            std::fs::read_to_string(project.join("README.md")).unwrap(),
            "hello"
        );
        assert!(runtimes.is_dir(), "only the runtime goes");
        // Missing is fine.
        remove(&runtime.dir).unwrap();
        remove(&runtimes.join("never-made")).unwrap();
    }

    #[test]
    fn write_generated_replaces_a_planted_symlink_without_writing_through_it() {
        let (tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "original").unwrap();
        let file = runtime.dir.join("AGENTS.md");
        symlink(&victim, &file).unwrap();

        let hash = write_generated(&runtime.dir, Path::new("AGENTS.md"), "guidance").unwrap();
        assert_eq!(hash, hex::encode(Sha256::digest(b"guidance")));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original");
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert!(meta.is_file() && !meta.file_type().is_symlink());
        assert_eq!(mode_of(&file), 0o600);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "guidance");

        // Rewritten in place next turn; no temporary file left behind.
        write_generated(&runtime.dir, Path::new("AGENTS.md"), "changed").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "changed");
        let litter: Vec<_> = std::fs::read_dir(&runtime.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(litter.is_empty(), "{litter:?}");
    }

    #[test]
    fn write_generated_makes_folders_and_does_not_follow_planted_ones() {
        let (tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        // A folder link planted where the config's folder belongs.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, runtime.home.join(".codex")).unwrap();
        // And a directory planted where a file belongs.
        std::fs::create_dir_all(runtime.dir.join("CLAUDE.md/sub")).unwrap();

        write_generated(&runtime.dir, Path::new("home/.codex/config.toml"), "x = 1").unwrap();
        write_generated(&runtime.dir, Path::new("CLAUDE.md"), "c").unwrap();
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        let folder = std::fs::symlink_metadata(runtime.home.join(".codex")).unwrap();
        assert!(folder.is_dir() && !folder.file_type().is_symlink());
        assert_eq!(
            std::fs::read_to_string(runtime.home.join(".codex/config.toml")).unwrap(),
            "x = 1"
        );
        assert_eq!(
            std::fs::read_to_string(runtime.dir.join("CLAUDE.md")).unwrap(),
            "c"
        );
    }

    #[test]
    fn write_generated_refuses_the_project_and_odd_paths() {
        let (_tmp, runtimes, project) = setup();
        let runtime = prepare(&runtimes, &key(), Some(&project)).unwrap();
        for bad in [
            "project/AGENTS.md",
            "../x",
            "/etc/x",
            "",
            "a/../b",
            "project",
        ] {
            let err = write_generated(&runtime.dir, Path::new(bad), "x").unwrap_err();
            assert!(
                matches!(err, RuntimeError::BadRelative { .. }),
                "{bad}: {err}"
            );
        }
        assert!(!project.join("AGENTS.md").exists());
        assert_eq!(std::fs::read_link(&runtime.project_link).unwrap(), project);
    }

    #[test]
    fn guidance_says_the_path_rule_the_mode_and_the_target() {
        let target = Path::new("/srv/docs/alpha");
        let run = guidance(Mode::Run, target, &["src".into()], &[], &[]);
        assert!(run.contains("/srv/docs/alpha"));
        assert!(run.contains("`project/<path>`"));
        assert!(run.contains("cd project && "));
        assert!(run.contains("read-only"));
        assert!(!run.contains("`src`"), "Run lists no write grants");

        let builder = guidance(
            Mode::Builder,
            target,
            &["src".into(), "docs".into()],
            &["secrets".into()],
            &["vendor".into()],
        );
        for expected in [
            "`src`",
            "`docs`",
            "`secrets`",
            "`vendor`",
            "`workflow.json`",
            "`product.json`",
        ] {
            assert!(builder.contains(expected), "{expected} missing:\n{builder}");
        }
        assert!(!builder.contains("Mode: Run"));
        let none = guidance(Mode::Builder, target, &[], &[], &[]);
        assert!(none.contains("no write grants"));
    }

    #[test]
    fn session_key_changes_with_guidance_mode_chat_and_provider() {
        let text = guidance(Mode::Run, Path::new("/p"), &[], &[], &[]);
        let hash = hex::encode(Sha256::digest(text.as_bytes()));
        let base = session_key(&key(), std::slice::from_ref(&hash));
        assert_eq!(
            base,
            session_key(&key(), std::slice::from_ref(&hash)),
            "stable"
        );

        let changed = guidance(Mode::Run, Path::new("/q"), &[], &[], &[]);
        let changed_hash = hex::encode(Sha256::digest(changed.as_bytes()));
        let others = [
            session_key(&key(), &[changed_hash]),
            session_key(&key(), &[]),
            session_key(&key(), &[hash.clone(), hash.clone()]),
            session_key(
                &RuntimeKey {
                    mode: Mode::Builder,
                    ..key()
                },
                std::slice::from_ref(&hash),
            ),
            session_key(
                &RuntimeKey {
                    chat_id: "c2",
                    ..key()
                },
                std::slice::from_ref(&hash),
            ),
            session_key(
                &RuntimeKey {
                    provider: "other",
                    ..key()
                },
                std::slice::from_ref(&hash),
            ),
        ];
        let mut seen = std::collections::BTreeSet::from([base]);
        for other in others {
            assert!(seen.insert(other.clone()), "{other} collides");
        }
    }
}
