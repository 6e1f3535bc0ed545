//! A writable folder's protected project config: the files and git config keys that make the
//! person's own tools run a program of their choosing, recorded before each command and put back
//! once the command's last process is gone.
//!
//! Why: a command in a `--write-folder` set `core.fsmonitor` in `.git/config`, and the person's
//! next `git status`, outside every sandbox, ran it. Hooks, `core.hooksPath`, `.envrc` and editor
//! task files are the same door. Landlock cannot deny a path inside a granted folder, and making
//! all of `.git` read-only breaks `git commit`; so the set is allowed to change while the command
//! runs, and every change to it is undone afterwards, with the rest of the folder, and the rest
//! of each config file, left as the command made it (`git remote add`, `git branch -u` and
//! `git config user.name` stay). The result says what was undone ([`Undone`]).
//!
//! The set, in every repository and linked worktree found in the folder (nested ones too, see
//! the bounds below):
//!
//! - in each git config file (the repository's `config` and `config.worktree`, its worktrees'
//!   and submodules' configs, and every file one of them includes that lies in the folder), the
//!   keys of [`is_protected_key`]: they name a program git runs (`core.fsmonitor`,
//!   `core.hooksPath`, `core.sshCommand`, `core.pager`, `core.editor`, `core.askPass`,
//!   `diff.external`, `*.textconv`, `filter.*.clean`/`smudge`/`process`, `merge.*.driver`,
//!   `credential.helper`, `gpg.program`, `sequence.editor`, `!` aliases, and a few more of the
//!   same kind) or pull in more config (`include.path`, `includeIf.*.path`);
//! - the files in `.git/hooks/` (not the `*.sample`s, which git never runs) and in the folder
//!   `core.hooksPath` names, when it lies in the folder; each `.git` file (a worktree's pointer
//!   to its git directory);
//! - `.envrc` (direnv) in every folder walked, and at the folder's top and each repository's:
//!   `.vscode/tasks.json`, `.vscode/settings.json`, `.mcp.json` and everything in `.claude/`,
//!   `.codex/`, `.gemini/` and `.cursor/` (the coding CLIs' project config, hooks included).
//!
//! Undoing: a new file is removed, a changed or removed one written back (a new file beside it,
//! then renamed over it, so a hard link the command put there is never written through), a
//! protected key added or changed is taken out and its former entries put back at the end of
//! the file. Every path is opened beneath the folder with no symlink followed; a symlink the
//! command put on the way (`.git/hooks` → elsewhere) is removed, never followed.
//!
//! Bounds (so a huge tree costs a bounded walk): folders are walked [`MAX_DEPTH`] deep and at
//! most [`MAX_FOLDERS`] of them, `node_modules`, `target`, `.venv`, `venv`, `__pycache__` and
//! the insides of `.git` (beyond the parts above) skipped (5,000 folders took about a quarter
//! of a second to walk in a debug build, 50 about 2 ms); a protected file over [`MAX_FILE_BYTES`] is recorded by its size and hash
//! only, and a change to it is reported as not undone. The permissions text says so.
//!
//! Owns: [`Snapshot::take`], [`Snapshot::undo`]. Must never: follow a symlink, write outside the
//! folder, write through an existing file, or report as undone what was not.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use sha2::{Digest, Sha256};

use agentworks_contract::executor::UndoneChange;

use crate::gitconfig::{self, Entry};

/// How deep folders are walked for nested repositories and `.envrc` files.
pub const MAX_DEPTH: usize = 6;
/// How many folders one walk visits at most.
pub const MAX_FOLDERS: usize = 5_000;
/// The largest protected file kept whole (larger ones: size and hash only).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// How many files one coding CLI's folder (`.claude/`, …) contributes at most.
const MAX_TOOL_FILES: usize = 500;
/// How many includes deep a config is followed (git's own limit is 10).
const MAX_INCLUDE_DEPTH: usize = 10;

/// The project files tools run on their own, at a folder's top and each repository's.
const TOOL_FILES: &[&str] = &[".vscode/tasks.json", ".vscode/settings.json", ".mcp.json"];
/// The coding CLIs' project folders, protected whole.
const TOOL_DIRS: &[&str] = &[".claude", ".codex", ".gemini", ".cursor"];
/// Folders never walked into: `.git` (its parts are read as the set says), and the trees of
/// dependencies and build output, thousands of folders where no one keeps a repository.
const SKIPPED: &[&str] = &[
    ".git",
    "node_modules",
    "target",
    ".venv",
    "venv",
    "__pycache__",
];

/// Whether the git config key `section.subsection.name` (section and name lowercase) with
/// `value` names a program git runs, or pulls in more config.
pub fn is_protected_key(
    section: &str,
    subsection: Option<&str>,
    name: &str,
    value: Option<&str>,
) -> bool {
    let starts_with_bang = || value.is_some_and(|v| v.trim_start().starts_with('!'));
    match (section, subsection, name) {
        (
            "core",
            None,
            "fsmonitor"
            | "hookspath"
            | "sshcommand"
            | "pager"
            | "editor"
            | "askpass"
            | "gitproxy"
            | "alternaterefscommand",
        ) => true,
        ("diff", None, "external") => true,
        (_, Some(_), "textconv") => true,
        ("diff", Some(_), "command") => true,
        ("filter", Some(_), "clean" | "smudge" | "process") => true,
        ("merge", Some(_), "driver") => true,
        ("credential", _, "helper") => true,
        ("gpg", _, "program") | ("gpg", Some(_), "defaultkeycommand") => true,
        ("sequence", None, "editor") => true,
        ("alias", _, _) => starts_with_bang(),
        ("include", None, "path") | ("includeif", Some(_), "path") => true,
        ("pager", _, _) => true,
        ("interactive", None, "difffilter") => true,
        ("difftool" | "mergetool", Some(_), "cmd") => true,
        ("submodule", Some(_), "update") => starts_with_bang(),
        ("remote", Some(_), "uploadpack" | "receivepack") => true,
        ("protocol", _, "allow") => true,
        ("uploadpack", None, "packobjectshook") => true,
        _ => false,
    }
}

fn protected(entry: &Entry) -> bool {
    is_protected_key(
        &entry.section,
        entry.subsection.as_deref(),
        &entry.name,
        entry.value.as_deref(),
    )
}

/// What connect prints about the protected project config: what it is, how far the walk
/// reaches, and what `--allow-project-config` (`allowed`) changes.
pub fn permissions_text(allowed: bool) -> String {
    let what = format!(
        "Project config that makes your own tools run programs: git hooks and the git config \
         keys that name a program (core.fsmonitor, core.hooksPath, core.sshCommand, core.pager, \
         core.editor, diff and merge drivers, filters, credential helpers, gpg.program, \
         !-aliases, include.path, …), .envrc, .vscode/tasks.json and settings.json, .mcp.json, \
         .claude/, .codex/, .gemini/ and .cursor/, in each writable folder and every repository \
         in it (nested ones up to {MAX_DEPTH} folders deep, the first {MAX_FOLDERS} folders, \
         node_modules, target, .venv, venv and __pycache__ skipped)"
    );
    if allowed {
        format!(
            "{what}: commands and patches may change it (--allow-project-config), so a command \
             can make your next git command, cd (direnv) or editor run a program of its \
             choosing, outside the sandbox.\n"
        )
    } else {
        format!(
            "{what}: a command may change it while it runs, and every change is undone when the \
             command ends (the rest of a git config keeps the command's changes, so git remote \
             add or git config user.name stay) and reported with its result; patches are \
             refused there. --allow-project-config keeps such changes.\n"
        )
    }
}

/// What one protected path was.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Missing,
    /// A folder on the way to it is a symlink (git, direnv or an editor would follow it here).
    BehindSymlink {
        folder: PathBuf,
        target: PathBuf,
    },
    Dir,
    /// A regular file kept whole, with its permission bits.
    File {
        content: Vec<u8>,
        mode: u32,
    },
    /// A regular file too large to keep.
    Large {
        size: u64,
        hash: [u8; 32],
    },
    Symlink {
        target: PathBuf,
    },
    /// A folder, a FIFO, a socket, a device: only its kind is compared.
    Other {
        kind: u32,
    },
}

/// What kind of protected path it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Compared and put back whole.
    File,
    /// A git config: only its protected keys are compared and put back.
    Config,
    /// A folder that holds protected files (`.git`, `.git/hooks`, `.vscode`, `.claude`, …): only
    /// a symlink or a file put in its place is undone (a tool would follow it to files the walk
    /// never sees); what it holds is each file's own business.
    Folder,
}

/// The protected set of one folder at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The folder (canonical).
    root: PathBuf,
    /// How paths are shown in [`UndoneChange`]s: the folder's alias, or `~/Downloads`.
    label: String,
    items: BTreeMap<PathBuf, (Kind, State)>,
    /// Whether a walk stopped at [`MAX_FOLDERS`].
    pub truncated: bool,
}

impl Snapshot {
    /// The protected set of `root` now. `label` names the folder in the undone changes.
    pub fn take(root: &Path, label: &str) -> std::io::Result<Snapshot> {
        let root_fd = open_root(root)?;
        let mut walk = Walk::new(root_fd.as_fd(), root);
        walk.collect(&BTreeMap::new());
        Ok(Snapshot {
            root: root.to_owned(),
            label: label.to_owned(),
            items: walk.items,
            truncated: walk.truncated,
        })
    }

    /// Whether `path` (absolute) is in this protected set.
    pub fn contains(&self, path: &Path) -> bool {
        path.strip_prefix(&self.root)
            .is_ok_and(|relative| self.items.contains_key(relative))
    }

    /// Puts back every change to the protected set since this snapshot; what was undone.
    pub fn undo(&self) -> Vec<UndoneChange> {
        let root_fd = match open_root(&self.root) {
            Ok(fd) => fd,
            Err(e) => {
                return vec![UndoneChange {
                    path: self.label.clone(),
                    change: format!("could not be checked: {e}"),
                    undone: false,
                }];
            }
        };
        let known: BTreeMap<PathBuf, Kind> = self
            .items
            .iter()
            .map(|(p, (k, _))| (p.clone(), *k))
            .collect();
        let mut walk = Walk::new(root_fd.as_fd(), &self.root);
        walk.collect(&known);
        let mut undone = Vec::new();
        let paths: BTreeSet<&PathBuf> = self.items.keys().chain(walk.items.keys()).collect();
        for path in paths {
            let before = self.items.get(path);
            let after = walk.items.get(path);
            let kind = before.or(after).map(|(k, _)| *k).unwrap_or(Kind::File);
            let before_state = before.map(|(_, s)| s).unwrap_or(&State::Missing);
            let after_state = after.map(|(_, s)| s).unwrap_or(&State::Missing);
            let shown = format!("{}/{}", self.label, path.display());
            let change = match kind {
                Kind::File if before_state != after_state => {
                    Some(undo_file(root_fd.as_fd(), path, before_state, after_state))
                }
                Kind::Config => undo_config(root_fd.as_fd(), path, before_state, after_state),
                Kind::Folder => undo_folder(root_fd.as_fd(), path, before_state, after_state),
                Kind::File => None,
            };
            if let Some((change, done)) = change {
                undone.push(UndoneChange {
                    path: shown,
                    change,
                    undone: done,
                });
            }
        }
        undone
    }
}

fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `path` (relative, no `..`) as the `/`-separated text `open_beneath` takes.
fn text(path: &Path) -> Option<&str> {
    path.to_str()
}

/// Opens `path` beneath `root` with `flags`, never following a symlink.
fn open_at(root: BorrowedFd<'_>, path: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let Some(path) = text(path) else {
        return Err(rustix::io::Errno::INVAL);
    };
    agentworks_fs::confine::open_beneath(root, path, flags | OFlags::NOFOLLOW, Mode::empty())
}

/// How a folder is opened only to look beneath it: `O_PATH` on Linux; macOS has none.
#[cfg(target_os = "linux")]
const LOOK_ONLY: OFlags = OFlags::PATH;
#[cfg(target_os = "macos")]
const LOOK_ONLY: OFlags = OFlags::RDONLY;

/// The file-type bits of a mode (`mode_t` is 32 bits on Linux, 16 on macOS).
#[allow(clippy::useless_conversion)]
fn kind_bits(mode: libc::mode_t) -> u32 {
    u32::from(mode & libc::S_IFMT)
}

/// The permission bits of a mode.
#[allow(clippy::useless_conversion)]
fn permission_bits(mode: libc::mode_t) -> u32 {
    u32::from(mode & 0o7777)
}

/// The state of `path` beneath `root`.
fn read_state(root: BorrowedFd<'_>, path: &Path) -> State {
    let parent = path.parent().unwrap_or(Path::new(""));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Some(name) = path.file_name() else {
        return State::Missing;
    };
    let dir = match open_at(root, parent, LOOK_ONLY | OFlags::DIRECTORY) {
        Ok(dir) => dir,
        Err(rustix::io::Errno::LOOP) => return behind_symlink(root, parent),
        Err(_) => return State::Missing,
    };
    let Ok(stat) = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) else {
        return State::Missing;
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Symlink => match rustix::fs::readlinkat(&dir, name, Vec::new()) {
            Ok(target) => State::Symlink {
                target: PathBuf::from(OsStr::from_bytes(target.as_bytes())),
            },
            Err(_) => State::Other {
                kind: kind_bits(stat.st_mode),
            },
        },
        FileType::RegularFile => {
            let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
            let Ok(fd) = rustix::fs::openat(
                &dir,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                return State::Other {
                    kind: kind_bits(stat.st_mode),
                };
            };
            let mut content = Vec::new();
            let mut file = std::fs::File::from(fd);
            if size > MAX_FILE_BYTES {
                let mut hasher = Sha256::new();
                let mut chunk = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = file.read(&mut chunk) {
                    hasher.update(&chunk[..n]);
                }
                return State::Large {
                    size,
                    hash: hasher.finalize().into(),
                };
            }
            if Read::by_ref(&mut file)
                .take(MAX_FILE_BYTES + 1)
                .read_to_end(&mut content)
                .is_err()
            {
                return State::Other {
                    kind: kind_bits(stat.st_mode),
                };
            }
            State::File {
                content,
                mode: permission_bits(stat.st_mode),
            }
        }
        FileType::Directory => State::Dir,
        _ => State::Other {
            kind: kind_bits(stat.st_mode),
        },
    }
}

/// The first symlink on the way to `folder` beneath `root`, and where it points.
fn behind_symlink(root: BorrowedFd<'_>, folder: &Path) -> State {
    let mut walked = PathBuf::new();
    for component in folder.components() {
        walked.push(component);
        if let State::Symlink { target } = read_state(root, &walked) {
            return State::BehindSymlink {
                folder: walked,
                target,
            };
        }
    }
    State::Missing
}

/// One walk over a folder: which paths are protected, and their states.
struct Walk<'a> {
    root: BorrowedFd<'a>,
    /// The folder's path, to read an absolute `gitdir:` that points into it.
    root_path: &'a Path,
    items: BTreeMap<PathBuf, (Kind, State)>,
    folders: usize,
    truncated: bool,
}

impl<'a> Walk<'a> {
    fn new(root: BorrowedFd<'a>, root_path: &'a Path) -> Walk<'a> {
        Walk {
            root,
            root_path,
            items: BTreeMap::new(),
            folders: 0,
            truncated: false,
        }
    }

    fn add(&mut self, path: PathBuf, kind: Kind) {
        if self.items.contains_key(&path) {
            return;
        }
        let state = read_state(self.root, &path);
        self.items.insert(path, (kind, state));
    }

    /// Walks the folder; `also` are the paths of an earlier snapshot, read (with the kind they
    /// had) whatever this walk finds.
    fn collect(&mut self, also: &BTreeMap<PathBuf, Kind>) {
        self.project_root(Path::new(""));
        let mut stack: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
        while let Some((dir, depth)) = stack.pop() {
            if self.folders >= MAX_FOLDERS {
                self.truncated = true;
                break;
            }
            self.folders += 1;
            self.add(dir.join(".envrc"), Kind::File);
            let entries = list_typed(self.root, &dir);
            if entries.iter().any(|(n, _)| n == ".git") {
                if !dir.as_os_str().is_empty() {
                    self.project_root(&dir);
                }
                self.repository(&dir);
            }
            if depth >= MAX_DEPTH {
                continue;
            }
            for (name, kind) in entries {
                if kind == FileType::Directory && !SKIPPED.iter().any(|s| OsStr::new(s) == name) {
                    stack.push((dir.join(&name), depth + 1));
                }
            }
        }
        for (path, kind) in also {
            self.add(path.clone(), *kind);
        }
    }

    /// The tool files at the top of a project.
    fn project_root(&mut self, dir: &Path) {
        self.add(dir.join(".vscode"), Kind::Folder);
        for file in TOOL_FILES {
            self.add(dir.join(file), Kind::File);
        }
        for tool in TOOL_DIRS {
            let tool_dir = dir.join(tool);
            self.add(tool_dir.clone(), Kind::Folder);
            let mut files = Vec::new();
            files_beneath(self.root, &tool_dir, &mut files, MAX_TOOL_FILES);
            for file in files {
                self.add(file, Kind::File);
            }
        }
    }

    /// A repository whose `.git` is in `dir`: a folder (its git directory); a file (a linked
    /// worktree's or submodule's pointer: the git directory it names is walked when it lies in
    /// the folder, so a pointer to a planted one changes nothing, and `git worktree add` keeps
    /// working); or a symlink, which git would follow and this never does (protected itself).
    fn repository(&mut self, dir: &Path) {
        let dot_git = dir.join(".git");
        match read_state(self.root, &dot_git) {
            State::Dir => {
                self.add(dot_git.clone(), Kind::Folder);
                self.git_dir(&dot_git, dir, 0);
            }
            State::File { content, .. } => {
                let text = String::from_utf8_lossy(&content);
                if let Some(target) = text.trim().strip_prefix("gitdir:") {
                    let target = Path::new(target.trim());
                    let relative = match target.strip_prefix(self.root_path) {
                        Ok(inner) => Some(inner.to_owned()),
                        Err(_) => inside(dir, target),
                    };
                    if let Some(git_dir) = relative {
                        self.git_dir(&git_dir, dir, 0);
                    }
                }
            }
            _ => self.add(dot_git, Kind::File),
        }
    }

    /// A git directory: its configs (and what they include), hooks, the folder
    /// `core.hooksPath` names, its worktrees' configs and its submodules' git directories.
    fn git_dir(&mut self, git_dir: &Path, work_tree: &Path, depth: usize) {
        if depth > 4 {
            return;
        }
        for name in ["config", "config.worktree"] {
            self.config(&git_dir.join(name), work_tree, 0);
        }
        self.hooks(&git_dir.join("hooks"));
        for worktree in list(self.root, &git_dir.join("worktrees")) {
            let worktree = git_dir.join("worktrees").join(worktree);
            self.config(&worktree.join("config.worktree"), work_tree, 0);
        }
        let modules = git_dir.join("modules");
        for module in list(self.root, &modules) {
            self.git_dir(&modules.join(module), work_tree, depth + 1);
        }
    }

    /// Every file of a hooks folder but the samples.
    fn hooks(&mut self, hooks: &Path) {
        self.add(hooks.to_owned(), Kind::Folder);
        for name in list(self.root, hooks).into_iter().take(MAX_TOOL_FILES) {
            if !name.as_bytes().ends_with(b".sample") {
                self.add(hooks.join(name), Kind::File);
            }
        }
    }

    /// A config file, the files it includes that lie in the folder, and the hooks folder it
    /// names.
    fn config(&mut self, path: &Path, work_tree: &Path, depth: usize) {
        if depth > MAX_INCLUDE_DEPTH || self.items.contains_key(path) {
            return;
        }
        self.add(path.to_owned(), Kind::Config);
        let Some((_, State::File { content, .. })) = self.items.get(path) else {
            return;
        };
        let Ok(entries) = gitconfig::parse(&String::from_utf8_lossy(content)) else {
            return;
        };
        let base = path.parent().unwrap_or(Path::new(""));
        for entry in entries {
            let Some(value) = entry.value.as_deref() else {
                continue;
            };
            match (entry.section.as_str(), entry.name.as_str()) {
                ("include" | "includeif", "path") => {
                    if let Some(included) = inside(base, Path::new(value)) {
                        self.config(&included, work_tree, depth + 1);
                    }
                }
                ("core", "hookspath") => {
                    if let Some(hooks) = inside(work_tree, Path::new(value)) {
                        self.hooks(&hooks);
                    }
                }
                _ => {}
            }
        }
    }
}

/// `target` (relative to `base`, itself relative to the folder) as a path in the folder, `..`
/// resolved by name; `None` when absolute or outside the folder.
fn inside(base: &Path, target: &Path) -> Option<PathBuf> {
    if target.is_absolute() {
        return None;
    }
    let mut out = PathBuf::new();
    for component in base.join(target).components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The names in the folder `dir` beneath `root` (empty when it is not a folder one can read).
fn list(root: BorrowedFd<'_>, dir: &Path) -> Vec<std::ffi::OsString> {
    list_typed(root, dir).into_iter().map(|(n, _)| n).collect()
}

/// [`list`] with each entry's type as the folder gives it (`Unknown` where the filesystem does
/// not say, which is then never walked into).
fn list_typed(root: BorrowedFd<'_>, dir: &Path) -> Vec<(std::ffi::OsString, FileType)> {
    let path = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(fd) = open_at(root, path, OFlags::RDONLY | OFlags::DIRECTORY) else {
        return Vec::new();
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&fd) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            (
                OsStr::from_bytes(e.file_name().to_bytes()).to_owned(),
                e.file_type(),
            )
        })
        .filter(|(n, _)| n != "." && n != "..")
        .collect()
}

/// Every file (not folder) beneath `dir`, up to `max`.
fn files_beneath(root: BorrowedFd<'_>, dir: &Path, out: &mut Vec<PathBuf>, max: usize) {
    for (name, kind) in list_typed(root, dir) {
        if out.len() >= max {
            return;
        }
        let path = dir.join(name);
        if kind == FileType::Directory {
            files_beneath(root, &path, out, max);
        } else {
            out.push(path);
        }
    }
}

/// A folder that holds protected files: a symlink (or anything but a folder) the command put in
/// its place is removed, and the folder made again when there was one; the files it held are
/// put back as files of their own.
fn undo_folder(
    root: BorrowedFd<'_>,
    path: &Path,
    before: &State,
    after: &State,
) -> Option<(String, bool)> {
    if before == after || matches!(after, State::Dir | State::Missing) {
        return None;
    }
    if matches!(after, State::BehindSymlink { .. }) {
        // The symlink above it is its own item, or is undone with the first file below it.
        return None;
    }
    let result = match before {
        State::Dir => write_back(root, path, |dir, name| {
            remove_entry(dir, name)?;
            rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)).map_err(Into::into)
        })
        .map(|()| "it was replaced (by a symlink or a file): removed, and the folder made again"),
        State::Missing => {
            remove(root, path).map(|()| "it was made as a symlink or a file: removed")
        }
        _ => return Some(undo_file(root, path, before, after)),
    };
    Some(match result {
        Ok(change) => (change.to_owned(), true),
        Err(e) => (
            format!("it was replaced, and undoing that failed: {e}"),
            false,
        ),
    })
}

/// Puts a protected file back as it was: `(what happened, whether it was undone)`.
fn undo_file(root: BorrowedFd<'_>, path: &Path, before: &State, after: &State) -> (String, bool) {
    // A symlink the command put above it: removed first (the folder made again), never followed.
    if let State::BehindSymlink { folder, .. } = after
        && !matches!(before, State::BehindSymlink { .. })
        && let Err(e) = open_parent_making(root, folder)
    {
        return (
            format!("a folder above it was replaced by a symlink, and removing it failed: {e}"),
            false,
        );
    }
    if matches!(after, State::BehindSymlink { .. }) && *before == State::Missing {
        return (
            "a folder above it was replaced by a symlink: removed, and the folder made again"
                .to_owned(),
            true,
        );
    }
    let result = match before {
        State::Missing => remove(root, path).map(|()| "it was new: removed".to_owned()),
        State::File { content, mode } => write_back(root, path, |dir, name| {
            replace_file(dir, name, content, *mode)
        })
        .map(|()| match after {
            State::Missing => "it was removed: written back".to_owned(),
            _ => "it was changed: written back as it was".to_owned(),
        }),
        State::Symlink { target } => write_back(root, path, |dir, name| {
            let _ = remove_entry(dir, name);
            rustix::fs::symlinkat(target.as_path(), dir, name).map_err(std::io::Error::from)
        })
        .map(|()| "it was changed: the symlink was put back".to_owned()),
        State::Dir => write_back(root, path, |dir, name| {
            remove_entry(dir, name)?;
            rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)).map_err(Into::into)
        })
        .map(|()| "it was replaced: the folder was made again".to_owned()),
        State::BehindSymlink { .. } | State::Large { .. } | State::Other { .. } => {
            return (
                "it was changed, and it could not be put back (it was too large to keep, or \
                 not a file)"
                    .to_owned(),
                false,
            );
        }
    };
    match result {
        Ok(change) => (change, true),
        Err(e) => (
            format!("it was changed, and putting it back failed: {e}"),
            false,
        ),
    }
}

/// A protected config: its protected keys compared and put back, the rest left as the
/// command made it.
fn undo_config(
    root: BorrowedFd<'_>,
    path: &Path,
    before: &State,
    after: &State,
) -> Option<(String, bool)> {
    let entries = |state: &State| -> Result<Vec<Entry>, String> {
        match state {
            State::Missing => Ok(Vec::new()),
            State::File { content, .. } => {
                gitconfig::parse(&String::from_utf8_lossy(content)).map_err(|e| e.to_string())
            }
            State::Large { .. }
            | State::Other { .. }
            | State::Symlink { .. }
            | State::Dir
            | State::BehindSymlink { .. } => Err("not a config file git reads".to_owned()),
        }
    };
    let before_entries = entries(before).unwrap_or_default();
    let before_protected: Vec<&Entry> = before_entries.iter().filter(|e| protected(e)).collect();
    let after_entries = match entries(after) {
        Ok(entries) => entries,
        // A config git cannot read runs nothing, but it is put back whole where it was kept.
        Err(why) => {
            if before == after {
                return None;
            }
            return Some(undo_file(root, path, before, after))
                .map(|(change, done)| (format!("{why}: {change}"), done));
        }
    };
    let after_protected: Vec<&Entry> = after_entries.iter().filter(|e| protected(e)).collect();
    let same = before_protected.len() == after_protected.len()
        && before_protected
            .iter()
            .zip(&after_protected)
            .all(|(a, b)| a.same(b));
    if same {
        return None;
    }
    let added: Vec<String> = after_protected
        .iter()
        .filter(|a| !before_protected.iter().any(|b| b.same(a)))
        .map(|a| describe(a))
        .collect();
    let removed: Vec<String> = before_protected
        .iter()
        .filter(|b| !after_protected.iter().any(|a| a.same(b)))
        .map(|b| describe(b))
        .collect();
    let mut change = Vec::new();
    if !added.is_empty() {
        change.push(format!("set {}: taken out", added.join(", ")));
    }
    if !removed.is_empty() {
        change.push(format!(
            "changed or removed {}: put back",
            removed.join(", ")
        ));
    }
    let change = change.join("; ");
    let after_text = match after {
        State::File { content, .. } => String::from_utf8_lossy(content).into_owned(),
        _ => String::new(),
    };
    let mut text = gitconfig::without(&after_text, &after_protected);
    if !before_protected.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        let kept: Vec<Entry> = before_protected.iter().map(|e| (*e).clone()).collect();
        text.push_str(&gitconfig::render(&kept));
    }
    let mode = match (after, before) {
        (State::File { mode, .. }, _) | (_, State::File { mode, .. }) => *mode,
        _ => 0o644,
    };
    let result = write_back(root, path, |dir, name| {
        replace_file(dir, name, text.as_bytes(), mode)
    });
    Some(match result {
        Ok(()) => (change, true),
        Err(e) => (format!("{change}; writing it failed: {e}"), false),
    })
}

/// `key = value` as a person reads it.
fn describe(entry: &Entry) -> String {
    match &entry.value {
        Some(value) => format!("{} = {value:?}", entry.key()),
        None => entry.key(),
    }
}

/// Runs `write` on the parent folder of `path` (opened beneath `root`, made when missing; a
/// symlink on the way is removed and replaced by a folder) and its file name.
fn write_back(
    root: BorrowedFd<'_>,
    path: &Path,
    write: impl FnOnce(BorrowedFd<'_>, &OsStr) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let dir = open_parent_making(root, path.parent().unwrap_or(Path::new("")))?;
    write(dir.as_fd(), name)
}

/// The folder `dir` beneath `root`, each component opened without following a symlink: a
/// missing one is made, a symlink or a file in its place removed first.
fn open_parent_making(root: BorrowedFd<'_>, dir: &Path) -> std::io::Result<OwnedFd> {
    let mut current = rustix::io::fcntl_dupfd_cloexec(root, 3)?;
    for component in dir.components() {
        let Component::Normal(name) = component else {
            return Err(std::io::Error::other("not a plain path"));
        };
        let opened = rustix::fs::openat(
            &current,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let next = match opened {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o755))?;
                rustix::fs::openat(
                    &current,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?
            }
            // A symlink (ELOOP) or a file (ENOTDIR) where a folder was: removed, never followed.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                remove_entry(current.as_fd(), name)?;
                rustix::fs::mkdirat(&current, name, Mode::from_raw_mode(0o755))?;
                rustix::fs::openat(
                    &current,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?
            }
            Err(e) => return Err(e.into()),
        };
        current = next;
    }
    Ok(current)
}

/// Writes `content` to a new file beside `name` in `dir` and renames it over `name`, so that
/// whatever `name` is now (a hard link to a file elsewhere, a symlink) is replaced, never
/// written through.
fn replace_file(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    content: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    let mut temp_name = b".agentworks-restore-".to_vec();
    temp_name.extend_from_slice(&rand::random::<u64>().to_be_bytes().map(|b| b % 26 + b'a'));
    let temp = OsStr::from_bytes(&temp_name);
    let fd = rustix::fs::openat(
        dir,
        temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode((mode & 0o777) as _),
    )?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(content)
        .and_then(|()| {
            rustix::fs::fchmod(&file, Mode::from_raw_mode((mode & 0o777) as _)).map_err(Into::into)
        })
        .and_then(|()| file.sync_all())
        .and_then(|()| rustix::fs::renameat(dir, temp, dir, name).map_err(Into::into));
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp, rustix::fs::AtFlags::empty());
    }
    written
}

/// Removes `path` beneath `root` (a folder with everything in it).
fn remove(root: BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new(""));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let dir = open_at(root, parent, OFlags::RDONLY | OFlags::DIRECTORY)?;
    remove_entry(dir.as_fd(), name)
}

/// Removes the entry `name` of `dir`: a file or symlink by `unlinkat`, a folder with its contents.
fn remove_entry(dir: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::ISDIR | rustix::io::Errno::PERM) => {
            let sub = rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            for child in list(sub.as_fd(), Path::new("")) {
                remove_entry(sub.as_fd(), &child)?;
            }
            rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::REMOVEDIR)?;
            Ok(())
        }
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_keys_are_protected_and_ordinary_ones_are_not() {
        let cases = [
            ("core", None, "fsmonitor", Some("x"), true),
            ("core", None, "hookspath", Some("h"), true),
            ("diff", Some("pdf"), "textconv", Some("x"), true),
            ("filter", Some("lfs"), "smudge", Some("x"), true),
            ("merge", Some("m"), "driver", Some("x"), true),
            ("credential", Some("https://h"), "helper", Some("x"), true),
            ("gpg", Some("ssh"), "program", Some("x"), true),
            ("alias", None, "st", Some("!sh -c evil"), true),
            ("alias", None, "st", Some("status"), false),
            ("include", None, "path", Some("x"), true),
            ("includeif", Some("gitdir:x"), "path", Some("x"), true),
            ("remote", Some("origin"), "url", Some("x"), false),
            ("branch", Some("main"), "remote", Some("origin"), false),
            ("user", None, "name", Some("Ann"), false),
            ("core", None, "bare", None, false),
        ];
        for (section, sub, name, value, want) in cases {
            assert_eq!(
                is_protected_key(section, sub, name, value),
                want,
                "{section}.{name}"
            );
        }
    }

    fn write(path: &Path, content: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, content).expect("write");
    }

    /// A folder holding a repository (`.git/config`, a hook of the person's), a `.vscode`
    /// folder, and a file outside it.
    fn folder() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical").join("proj");
        write(&root.join(".git/config"), "[core]\n\tbare = false\n");
        write(&root.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n");
        write(&root.join(".git/hooks/pre-push.sample"), "sample\n");
        write(&root.join(".vscode/extensions.json"), "{}\n");
        let outside = dir
            .path()
            .canonicalize()
            .expect("canonical")
            .join("outside.txt");
        write(&outside, "outside\n");
        (dir, root, outside)
    }

    fn paths(undone: &[UndoneChange]) -> Vec<&str> {
        undone.iter().map(|u| u.path.as_str()).collect()
    }

    /// Symlinks the command put where the set's folders were are removed, never followed, and
    /// what they led to is never written.
    #[test]
    fn symlinked_folders_of_the_set_are_removed_not_followed() {
        let (_dir, root, outside) = folder();
        let before = Snapshot::take(&root, "proj").expect("snapshot");
        write(&root.join("evil/pre-commit"), "#!/bin/sh\ntouch PWNED\n");
        write(&root.join("elsewhere/tasks.json"), "{\"tasks\": []}\n");
        std::fs::remove_dir_all(root.join(".git/hooks")).expect("rm hooks");
        std::os::unix::fs::symlink("../evil", root.join(".git/hooks")).expect("symlink");
        std::fs::remove_dir_all(root.join(".vscode")).expect("rm .vscode");
        std::os::unix::fs::symlink("elsewhere", root.join(".vscode")).expect("symlink");
        let undone = before.undo();
        assert!(undone.iter().all(|u| u.undone), "{undone:?}");
        assert!(paths(&undone).contains(&"proj/.git/hooks"), "{undone:?}");
        assert!(paths(&undone).contains(&"proj/.vscode"), "{undone:?}");
        let hooks = std::fs::symlink_metadata(root.join(".git/hooks")).expect("hooks");
        assert!(hooks.is_dir(), "still a symlink");
        assert_eq!(
            std::fs::read_to_string(root.join(".git/hooks/pre-commit")).expect("hook"),
            "#!/bin/sh\nexit 0\n"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("evil/pre-commit")).expect("evil"),
            "#!/bin/sh\ntouch PWNED\n",
            "the symlink's target was written"
        );
        assert!(
            !std::fs::symlink_metadata(root.join(".vscode"))
                .expect(".vscode")
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(&outside).expect("outside"),
            "outside\n"
        );
    }

    /// A hook replaced by a hard link to a file elsewhere: putting the hook back replaces the
    /// link, and the file it shared stays as it was.
    #[test]
    fn a_hard_link_in_the_set_is_replaced_not_written_through() {
        let (_dir, root, outside) = folder();
        let before = Snapshot::take(&root, "proj").expect("snapshot");
        let hook = root.join(".git/hooks/pre-commit");
        std::fs::remove_file(&hook).expect("rm");
        std::fs::hard_link(&outside, &hook).expect("link");
        let undone = before.undo();
        assert_eq!(
            paths(&undone),
            vec!["proj/.git/hooks/pre-commit"],
            "{undone:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&hook).expect("hook"),
            "#!/bin/sh\nexit 0\n"
        );
        assert_eq!(
            std::fs::read_to_string(&outside).expect("outside"),
            "outside\n"
        );
        // Samples and other .vscode files are not the set's.
        std::fs::write(root.join(".git/hooks/pre-push.sample"), "changed\n").expect("write");
        std::fs::write(root.join(".vscode/extensions.json"), "[]\n").expect("write");
        assert!(before.undo().is_empty());
    }

    #[test]
    fn paths_inside_the_folder_resolve_and_others_do_not() {
        assert_eq!(
            inside(Path::new("a/.git"), Path::new("../hooks")),
            Some(PathBuf::from("a/hooks"))
        );
        assert_eq!(inside(Path::new("a"), Path::new("../../x")), None);
        assert_eq!(inside(Path::new("a"), Path::new("/etc/x")), None);
    }
}
