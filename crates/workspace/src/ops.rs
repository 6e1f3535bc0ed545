//! The operations of workspaced: read, list, search, write, patch, move, delete, receipt,
//! history and restore, each for one project and one caller.
//!
//! Every operation runs on a blocking thread, under the project's cross-process lock, on fds
//! opened by `confine`. A change follows one order exactly (the README's "The guarantees"): idempotency check, revision
//! check, *prepared* receipt, stage + fsync + metadata carry-over, identity re-check, rename,
//! directory fsync, *applied* receipt, audit event. If the receipt store cannot record the
//! prepared receipt nothing is touched (fail closed); if it cannot confirm the outcome the
//! answer is `uncertain`, resolved later by request id.
//!
//! A regular file with more than one hard link is never read, searched, written or otherwise
//! changed (`confine::open_file` refuses it with `path_refused`, reason `hard_link`): its other
//! name can be any file on the filesystem, such as a root-only one outside the documents tree,
//! and every change reads the current content first (revision, receipt before-content). Search
//! skips such a file; listing still shows its name and size.
//!
//! This module never overwrites without a revision check, never follows a symlink, never
//! writes outside a project folder, and never retries a change on its own.

use crate::acl;
use crate::error::WorkspaceError;
use crate::lock::{LockError, ProjectLock};
use crate::receipts::{
    Operation, Receipt, ReceiptState, ReceiptStore, capped_before, new_receipt_id,
};
use agentworks_contract::workspaced::*;
use agentworks_core::guard::{RelPath, ResolvedGuard};
use agentworks_core::revision::Revision;
use agentworks_daemon::audit;
use agentworks_daemon::layout::{StateLayout, ensure_private_dir, root_key};
use agentworks_fs::confine::{self, ConfineError};
use agentworks_fs::failpoint::{self, Hit};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Name prefix of our staged files; swept at start. A dot-name, so it is also a private path
/// that no caller can read, list or write.
pub const TEMP_PREFIX: &str = ".agentworks-tmp-";
/// Longest accepted request id.
pub const MAX_REQUEST_ID_BYTES: usize = 200;
/// Most receipts one history call returns.
pub const MAX_HISTORY: usize = 100;
/// Most entries one list call returns.
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Search stops after reading this many bytes in total.
pub const MAX_SEARCH_BYTES: u64 = 64 * 1024 * 1024;
/// Deepest folder nesting walked by list, search and the temp sweep.
const MAX_WALK_DEPTH: usize = 64;

/// Bounds from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_file_bytes: u64,
    pub lock_timeout: Duration,
    pub search_max_results: usize,
}

/// The documents tree as workspaced serves it. Cheap to share behind an `Arc`.
pub struct Workspace {
    documents_root: PathBuf,
    documents_fd: OwnedFd,
    layout: StateLayout,
    limits: Limits,
    stores: Mutex<HashMap<String, Arc<Mutex<ReceiptStore>>>>,
    in_flight: Mutex<HashMap<(String, String, String), usize>>,
}

/// Called by `walk` for every visible entry with its path, kind, stat and parent folder;
/// returns whether to go on.
type WalkVisitor<'a> =
    dyn FnMut(&RelPath, EntryKind, &Stat, BorrowedFd<'_>) -> Result<bool, WorkspaceError> + 'a;

/// An open project: its folder fd and where its lock and receipts live.
struct Project {
    name: String,
    root: OwnedFd,
    root_path: PathBuf,
}

/// What a change will do once its receipt is prepared.
enum Action {
    Replace {
        parent: OwnedFd,
        name: String,
        content: Vec<u8>,
        existing: Option<(OwnedFd, Stat)>,
    },
    Move {
        from_parent: OwnedFd,
        from_name: String,
        stat: Stat,
        to_parent: OwnedFd,
        to_name: String,
    },
    Delete {
        parent: OwnedFd,
        name: String,
        stat: Stat,
    },
}

struct Planned {
    path: RelPath,
    to_path: Option<RelPath>,
    previous: Revision,
    resulting: Revision,
    before: Option<Vec<u8>>,
    action: Action,
}

/// The current state of one path, read under the lock.
struct Current {
    parent: OwnedFd,
    name: String,
    file: Option<(OwnedFd, Stat)>,
    content: Option<Vec<u8>>,
    revision: Revision,
}

fn lock_poisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these maps leaves valid data; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn same_identity(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

fn unchanged_since(a: &Stat, b: &Stat) -> bool {
    same_identity(a, b)
        && a.st_size == b.st_size
        && a.st_mtime == b.st_mtime
        && a.st_mtime_nsec == b.st_mtime_nsec
        && a.st_ctime == b.st_ctime
        && a.st_ctime_nsec == b.st_ctime_nsec
}

fn validate_request_id(id: &str) -> Result<(), WorkspaceError> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES || !id.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(WorkspaceError::InvalidRequest(format!(
            "request_id must be 1..={MAX_REQUEST_ID_BYTES} printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

fn parse_expected(raw: &str) -> Result<Revision, WorkspaceError> {
    Revision::parse(raw).map_err(|e| WorkspaceError::InvalidRequest(e.to_string()))
}

fn payload_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Read an fd to the end, refusing more than `limit` bytes.
fn read_bounded(fd: &OwnedFd, limit: u64, path: &RelPath) -> Result<Vec<u8>, WorkspaceError> {
    let mut file = std::fs::File::from(
        fd.try_clone()
            .map_err(|e| WorkspaceError::io("read", path, e))?,
    );
    let mut content = Vec::new();
    (&mut file)
        .take(limit + 1)
        .read_to_end(&mut content)
        .map_err(|e| WorkspaceError::io("read", path, e))?;
    if content.len() as u64 > limit {
        return Err(WorkspaceError::TooLarge {
            path: path.to_string(),
            size: rustix::fs::fstat(fd)
                .map(|s| s.st_size as u64)
                .unwrap_or(content.len() as u64),
            limit,
        });
    }
    Ok(content)
}

/// The revision of whatever `path` holds now, hashing without a size limit.
fn revision_on_disk(root: BorrowedFd<'_>, path: &RelPath) -> Result<Revision, WorkspaceError> {
    let parent = match confine::open_parent(root, path, false) {
        Ok((parent, _)) => parent,
        Err(ConfineError::NotFound { .. }) | Err(ConfineError::NotADirectory { .. }) => {
            return Ok(Revision::Missing);
        }
        Err(e) => return Err(e.into()),
    };
    let Some((fd, _)) = confine::open_file(parent.as_fd(), path.file_name(), path)? else {
        return Ok(Revision::Missing);
    };
    let mut file = std::fs::File::from(fd);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| WorkspaceError::io("read", path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(Revision::Sha256(hex::encode(hasher.finalize())))
}

fn fsync_fd(fd: BorrowedFd<'_>, what: &'static str, path: &RelPath) -> Result<(), WorkspaceError> {
    rustix::fs::fsync(fd).map_err(|e| WorkspaceError::io(what, path, e))
}

fn failpoint_io(name: &'static str, path: &RelPath) -> Result<(), WorkspaceError> {
    match failpoint::hit(name) {
        Hit::Continue => Ok(()),
        Hit::Fail => Err(WorkspaceError::io(
            name,
            path,
            std::io::Error::other("failpoint"),
        )),
    }
}

impl Workspace {
    /// Open the documents root (created 0755 if missing) and prepare the state layout.
    pub fn open(
        documents_root: &Path,
        layout: StateLayout,
        limits: Limits,
    ) -> Result<Workspace, WorkspaceError> {
        std::fs::create_dir_all(documents_root).map_err(|e| {
            WorkspaceError::io("create documents root", documents_root.display(), e)
        })?;
        let documents_root = documents_root.canonicalize().map_err(|e| {
            WorkspaceError::io("resolve documents root", documents_root.display(), e)
        })?;
        let documents_fd = rustix::fs::open(
            &documents_root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::io("open documents root", documents_root.display(), e))?;
        for (dir, mode) in [
            (layout.files_dir(), 0o700),
            (layout.files_dir().join("receipts"), 0o700),
            (layout.files_dir().join("locks"), 0o700),
        ] {
            ensure_private_dir(&dir, mode).map_err(|e| {
                WorkspaceError::io(
                    "prepare state directory",
                    dir.display(),
                    std::io::Error::other(e.to_string()),
                )
            })?;
        }
        Ok(Workspace {
            documents_root,
            documents_fd,
            layout,
            limits,
            stores: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    pub fn documents_root(&self) -> &Path {
        &self.documents_root
    }

    fn project(&self, name: &str) -> Result<Project, WorkspaceError> {
        let rel = RelPath::parse(name).map_err(|_| WorkspaceError::UnknownProject {
            project: name.into(),
        })?;
        if rel.as_str().contains('/') {
            return Err(WorkspaceError::UnknownProject {
                project: name.into(),
            });
        }
        let root =
            confine::open_dir(self.documents_fd.as_fd(), Some(&rel)).map_err(|e| match e {
                ConfineError::NotFound { .. } | ConfineError::NotADirectory { .. } => {
                    WorkspaceError::UnknownProject {
                        project: name.into(),
                    }
                }
                other => other.into(),
            })?;
        Ok(Project {
            name: rel.as_str().to_owned(),
            root,
            root_path: self.documents_root.join(rel.as_str()),
        })
    }

    fn lock(&self, project: &Project) -> Result<ProjectLock, LockError> {
        ProjectLock::acquire(
            &self.layout.lock_path(&project.root_path),
            self.limits.lock_timeout,
        )
    }

    fn store(&self, project: &Project) -> Result<Arc<Mutex<ReceiptStore>>, WorkspaceError> {
        let key = root_key(&project.root_path);
        if let Some(store) = lock_poisoned(&self.stores).get(&key) {
            return Ok(store.clone());
        }
        let dir = self.layout.receipts_dir(&project.root_path);
        ensure_private_dir(&dir, 0o700).map_err(|e| {
            WorkspaceError::io(
                "prepare receipts directory",
                dir.display(),
                std::io::Error::other(e.to_string()),
            )
        })?;
        let store = Arc::new(Mutex::new(ReceiptStore::open(&dir)?));
        lock_poisoned(&self.stores).insert(key, store.clone());
        Ok(store)
    }

    /// Read what `path` holds now (parent opened, created if `create_parent`).
    fn current(
        &self,
        project: &Project,
        path: &RelPath,
        create_parent: bool,
    ) -> Result<Current, WorkspaceError> {
        let (parent, name) = confine::open_parent(project.root.as_fd(), path, create_parent)?;
        let name = name.to_owned();
        match confine::open_file(parent.as_fd(), &name, path)? {
            None => Ok(Current {
                parent,
                name,
                file: None,
                content: None,
                revision: Revision::Missing,
            }),
            Some((fd, stat)) => {
                let content = read_bounded(&fd, self.limits.max_file_bytes, path)?;
                let revision = Revision::of(&content);
                Ok(Current {
                    parent,
                    name,
                    file: Some((fd, stat)),
                    content: Some(content),
                    revision,
                })
            }
        }
    }

    // ----- reads -----

    pub fn read(&self, req: &ReadRequest) -> Result<ReadResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let path = RelPath::parse(&req.path)?;
        guard.check_read(&path)?;
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let current = match self.current(&project, &path, false) {
            Err(WorkspaceError::Confine(ConfineError::NotADirectory { path }))
            | Err(WorkspaceError::Confine(ConfineError::NotFound { path })) => {
                return Err(ConfineError::NotFound { path }.into());
            }
            other => other?,
        };
        let Some(content) = current.content else {
            return Err(ConfineError::NotFound {
                path: path.to_string(),
            }
            .into());
        };
        let size = content.len() as u64;
        let content = String::from_utf8(content).map_err(|_| WorkspaceError::NotText {
            path: path.to_string(),
        })?;
        Ok(ReadResponse {
            path: path.to_string(),
            content,
            revision: current.revision,
            size,
        })
    }

    /// Walk `start` (depth-first, sorted), calling `visit` for every entry the guard lets the
    /// caller see. Dot-entries are never visited; symlinks are reported as `Other`, never followed.
    fn walk(
        &self,
        project: &Project,
        guard: &ResolvedGuard,
        start: Option<&RelPath>,
        recursive: bool,
        visit: &mut WalkVisitor<'_>,
    ) -> Result<(), WorkspaceError> {
        let first = confine::open_dir(project.root.as_fd(), start)?;
        let mut stack: Vec<(OwnedFd, Option<RelPath>, usize)> = vec![(first, start.cloned(), 0)];
        while let Some((dir, prefix, depth)) = stack.pop() {
            let mut names: Vec<String> = Vec::new();
            let listing = rustix::fs::Dir::read_from(&dir).map_err(|e| {
                WorkspaceError::io(
                    "list",
                    prefix.as_ref().map(|p| p.as_str()).unwrap_or("."),
                    e,
                )
            })?;
            for entry in listing {
                let entry = entry.map_err(|e| {
                    WorkspaceError::io(
                        "list",
                        prefix.as_ref().map(|p| p.as_str()).unwrap_or("."),
                        e,
                    )
                })?;
                if let Ok(name) = entry.file_name().to_str()
                    && !name.starts_with('.')
                {
                    names.push(name.to_owned());
                }
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let rel = match &prefix {
                    Some(p) => p.join(&name),
                    None => RelPath::parse(&name),
                };
                let Ok(rel) = rel else { continue };
                if guard.check_read(&rel).is_err() {
                    continue;
                }
                let Ok(stat) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                else {
                    continue;
                };
                let kind = match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
                    rustix::fs::FileType::RegularFile => EntryKind::File,
                    rustix::fs::FileType::Directory => EntryKind::Dir,
                    _ => EntryKind::Other,
                };
                if !visit(&rel, kind, &stat, dir.as_fd())? {
                    return Ok(());
                }
                if recursive && kind == EntryKind::Dir && depth + 1 < MAX_WALK_DEPTH {
                    match confine::open_dir(dir.as_fd(), Some(&RelPath::parse(&name)?)) {
                        Ok(fd) => subdirs.push((fd, Some(rel), depth + 1)),
                        // Replaced by a symlink since we listed it: skip, never follow.
                        Err(ConfineError::Symlink { .. }) | Err(ConfineError::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            // Reverse so the stack pops them in sorted order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    pub fn list(&self, req: &ListRequest) -> Result<ListResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let start = RelPath::parse_folder(&req.path)?;
        match &start {
            Some(p) => guard.check_read(p)?,
            None if guard.root_blocked() => {
                return Err(
                    agentworks_core::guard::GuardError::Blocked { path: ".".into() }.into(),
                );
            }
            None => {}
        }
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let mut entries = Vec::new();
        let mut truncated = false;
        self.walk(
            &project,
            &guard,
            start.as_ref(),
            req.recursive,
            &mut |rel, kind, stat, _| {
                if entries.len() >= MAX_LIST_ENTRIES {
                    truncated = true;
                    return Ok(false);
                }
                entries.push(ListEntry {
                    path: rel.to_string(),
                    kind,
                    size: (kind == EntryKind::File).then_some(stat.st_size as u64),
                });
                Ok(true)
            },
        )?;
        Ok(ListResponse { entries, truncated })
    }

    pub fn search(&self, req: &SearchRequest) -> Result<SearchResponse, WorkspaceError> {
        if req.query.is_empty() || req.query.len() > 1024 {
            return Err(WorkspaceError::InvalidRequest(
                "query must be 1..=1024 bytes".into(),
            ));
        }
        let guard = req.context.guard.resolve()?;
        let start = RelPath::parse_folder(&req.path)?;
        if let Some(p) = &start {
            guard.check_read(p)?;
        } else if guard.root_blocked() {
            return Err(agentworks_core::guard::GuardError::Blocked { path: ".".into() }.into());
        }
        let max_results = req
            .max_results
            .unwrap_or(self.limits.search_max_results)
            .clamp(1, self.limits.search_max_results);
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let mut matches = Vec::new();
        let mut truncated = false;
        let mut scanned = 0u64;
        let limit = self.limits.max_file_bytes;
        self.walk(
            &project,
            &guard,
            start.as_ref(),
            true,
            &mut |rel, kind, stat, dir| {
                if kind != EntryKind::File || stat.st_size as u64 > limit {
                    return Ok(true);
                }
                if scanned + stat.st_size as u64 > MAX_SEARCH_BYTES {
                    truncated = true;
                    return Ok(false);
                }
                // A file that cannot be opened as ours is skipped, not reported: a FIFO, a
                // symlink swapped in, and a file with a second hard link (its other name may be
                // a file outside the project; `open_file` refuses it). Skipping, not refusing the
                // whole search, so one planted link cannot deny search of the project, and
                // nothing of its content, not even whether it matches, reaches the caller.
                let Ok(Some((fd, _))) = confine::open_file(dir, rel.file_name(), rel) else {
                    return Ok(true);
                };
                let Ok(content) = read_bounded(&fd, limit, rel) else {
                    return Ok(true);
                };
                scanned += content.len() as u64;
                let Ok(text) = std::str::from_utf8(&content) else {
                    return Ok(true);
                };
                for (index, line) in text.lines().enumerate() {
                    if line.contains(&req.query) {
                        if matches.len() >= max_results {
                            truncated = true;
                            return Ok(false);
                        }
                        matches.push(SearchMatch {
                            path: rel.to_string(),
                            line: index as u64 + 1,
                            text: line.chars().take(500).collect(),
                        });
                    }
                }
                Ok(true)
            },
        )?;
        Ok(SearchResponse { matches, truncated })
    }

    // ----- changes -----

    pub fn write(&self, req: &WriteRequest) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        self.check_size(&path, req.content.len())?;
        let hash = payload_hash(&["write", path.as_str(), &req.expected_revision, &req.content]);
        self.change(
            &req.context,
            Operation::Write,
            &req.request_id,
            hash,
            |project| {
                let current = self.current(project, &path, expected == Revision::Missing)?;
                self.check_expected(&path, &expected, &current.revision)?;
                Ok(self.plan_replace(path.clone(), current, req.content.as_bytes().to_vec()))
            },
        )
    }

    pub fn patch(&self, req: &PatchRequest) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        self.check_size(&path, req.diff.len())?;
        let hash = payload_hash(&["patch", path.as_str(), &req.expected_revision, &req.diff]);
        self.change(
            &req.context,
            Operation::Patch,
            &req.request_id,
            hash,
            |project| {
                let current = self.current(project, &path, expected == Revision::Missing)?;
                self.check_expected(&path, &expected, &current.revision)?;
                let base = match &current.content {
                    Some(bytes) => {
                        std::str::from_utf8(bytes).map_err(|_| WorkspaceError::NotText {
                            path: path.to_string(),
                        })?
                    }
                    None => "",
                };
                let patched = agentworks_core::patch::apply_strict(base, &req.diff)?;
                self.check_size(&path, patched.len())?;
                Ok(self.plan_replace(path.clone(), current, patched.into_bytes()))
            },
        )
    }

    pub fn move_file(&self, req: &MoveRequest) -> Result<ChangeResponse, WorkspaceError> {
        let from = RelPath::parse(&req.path)?;
        let to = RelPath::parse(&req.to_path)?;
        let guard = req.context.guard.resolve()?;
        guard.check_write(&from)?;
        guard.check_write(&to)?;
        let expected = parse_expected(&req.expected_revision)?;
        if expected == Revision::Missing || from == to {
            return Err(WorkspaceError::InvalidRequest(
                "move needs the source's current revision and a different destination".into(),
            ));
        }
        let hash = payload_hash(&["move", from.as_str(), to.as_str(), &req.expected_revision]);
        self.change(
            &req.context,
            Operation::Move,
            &req.request_id,
            hash,
            |project| {
                let source = self.current(project, &from, false)?;
                self.check_expected(&from, &expected, &source.revision)?;
                let dest = self.current(project, &to, true)?;
                self.check_expected(&to, &Revision::Missing, &dest.revision)?;
                let Some((_, stat)) = source.file else {
                    return Err(ConfineError::NotFound {
                        path: from.to_string(),
                    }
                    .into());
                };
                Ok(Planned {
                    path: from.clone(),
                    to_path: Some(to.clone()),
                    previous: source.revision.clone(),
                    resulting: source.revision,
                    before: None,
                    action: Action::Move {
                        from_parent: source.parent,
                        from_name: source.name,
                        stat,
                        to_parent: dest.parent,
                        to_name: dest.name,
                    },
                })
            },
        )
    }

    pub fn delete(&self, req: &DeleteRequest) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        if expected == Revision::Missing {
            return Err(WorkspaceError::InvalidRequest(
                "delete needs the file's current revision, not \"missing\"".into(),
            ));
        }
        let hash = payload_hash(&["delete", path.as_str(), &req.expected_revision]);
        self.change(
            &req.context,
            Operation::Delete,
            &req.request_id,
            hash,
            |project| {
                let current = self.current(project, &path, false)?;
                self.check_expected(&path, &expected, &current.revision)?;
                self.plan_delete(path.clone(), current)
            },
        )
    }

    pub fn restore(&self, req: &RestoreRequest) -> Result<ChangeResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let expected = parse_expected(&req.expected_revision)?;
        let hash = payload_hash(&["restore", &req.receipt_id, &req.expected_revision]);
        self.change(&req.context, Operation::Restore, &req.request_id, hash, |project| {
            let store = self.store(project)?;
            let source = lock_poisoned(&store)
                .by_receipt_id(&req.receipt_id)?
                .ok_or_else(|| WorkspaceError::ReceiptNotFound {
                    request_id: req.receipt_id.clone(),
                })?;
            if source.state != ReceiptState::Applied || source.operation == Operation::Move {
                return Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} is a {} in state {:?}; only applied writes, patches, deletes and restores can be restored",
                    source.receipt_id,
                    source.operation.as_str(),
                    source.state
                )));
            }
            if source.before_truncated {
                return Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} kept only the first 128 KiB of the file; it cannot be restored from history",
                    source.receipt_id
                )));
            }
            let path = RelPath::parse(&source.path)?;
            guard.check_write(&path)?;
            let current = self.current(project, &path, true)?;
            self.check_expected(&path, &expected, &current.revision)?;
            match (&source.previous_revision, source.before_content) {
                (Revision::Missing, _) => {
                    if current.revision == Revision::Missing {
                        return Err(WorkspaceError::CannotRestore(format!("{path} already does not exist")));
                    }
                    self.plan_delete(path, current)
                }
                (previous, Some(before)) if Revision::of(&before) == *previous => {
                    Ok(self.plan_replace(path, current, before))
                }
                _ => Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} holds no complete before-content",
                    source.receipt_id
                ))),
            }
        })
    }

    fn check_size(&self, path: &RelPath, len: usize) -> Result<(), WorkspaceError> {
        if len as u64 > self.limits.max_file_bytes {
            return Err(WorkspaceError::TooLarge {
                path: path.to_string(),
                size: len as u64,
                limit: self.limits.max_file_bytes,
            });
        }
        Ok(())
    }

    fn check_expected(
        &self,
        path: &RelPath,
        expected: &Revision,
        current: &Revision,
    ) -> Result<(), WorkspaceError> {
        if expected != current {
            return Err(WorkspaceError::RevisionConflict {
                path: path.to_string(),
                expected: expected.clone(),
                current: current.clone(),
            });
        }
        Ok(())
    }

    fn plan_replace(&self, path: RelPath, current: Current, content: Vec<u8>) -> Planned {
        Planned {
            path,
            to_path: None,
            previous: current.revision,
            resulting: Revision::of(&content),
            before: current.content,
            action: Action::Replace {
                parent: current.parent,
                name: current.name,
                content,
                existing: current.file,
            },
        }
    }

    fn plan_delete(&self, path: RelPath, current: Current) -> Result<Planned, WorkspaceError> {
        let Some((_, stat)) = current.file else {
            return Err(ConfineError::NotFound {
                path: path.to_string(),
            }
            .into());
        };
        Ok(Planned {
            path,
            to_path: None,
            previous: current.revision,
            resulting: Revision::Missing,
            before: current.content,
            action: Action::Delete {
                parent: current.parent,
                name: current.name,
                stat,
            },
        })
    }

    /// The shared skeleton of every change; `plan` runs under the lock, after the idempotency
    /// check, and must not modify anything.
    fn change(
        &self,
        ctx: &Context,
        operation: Operation,
        request_id: &str,
        payload_hash: String,
        plan: impl FnOnce(&Project) -> Result<Planned, WorkspaceError>,
    ) -> Result<ChangeResponse, WorkspaceError> {
        validate_request_id(request_id)?;
        let project = self.project(&ctx.project)?;
        let flight_key = (
            project.name.clone(),
            ctx.principal.user_id.clone(),
            request_id.to_owned(),
        );
        *lock_poisoned(&self.in_flight)
            .entry(flight_key.clone())
            .or_insert(0) += 1;
        let result = self.change_in_flight(
            ctx,
            operation,
            request_id,
            payload_hash,
            &project,
            &flight_key,
            plan,
        );
        let mut in_flight = lock_poisoned(&self.in_flight);
        if let Some(count) = in_flight.get_mut(&flight_key) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&flight_key);
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn change_in_flight(
        &self,
        ctx: &Context,
        operation: Operation,
        request_id: &str,
        payload_hash: String,
        project: &Project,
        flight_key: &(String, String, String),
        plan: impl FnOnce(&Project) -> Result<Planned, WorkspaceError>,
    ) -> Result<ChangeResponse, WorkspaceError> {
        let _lock = match self.lock(project) {
            Ok(lock) => lock,
            Err(LockError::Timeout { .. })
                if lock_poisoned(&self.in_flight)
                    .get(flight_key)
                    .copied()
                    .unwrap_or(0)
                    > 1 =>
            {
                return Err(WorkspaceError::RequestInProgress {
                    request_id: request_id.into(),
                });
            }
            Err(e) => return Err(e.into()),
        };
        let store = self.store(project)?;
        // 1. Same id: replay the recorded outcome, or refuse a different payload.
        let recorded = lock_poisoned(&store).find(&ctx.principal.user_id, request_id)?;
        if let Some(mut receipt) = recorded {
            if receipt.payload_hash != payload_hash {
                return Err(WorkspaceError::RequestIdReused {
                    request_id: request_id.into(),
                    receipt_id: receipt.receipt_id,
                });
            }
            if receipt.state == ReceiptState::Prepared {
                self.reconcile(project, &store, &mut receipt)?;
            }
            return Ok(ChangeResponse {
                state: receipt.state,
                replayed: true,
                previous_revision: receipt.previous_revision.clone(),
                revision: receipt.resulting_revision.clone(),
                receipt,
            });
        }
        // 2. Revision check and planning (nothing changes yet).
        let planned = plan(project)?;
        // 3. Durable prepared receipt; if it cannot be written, refuse before touching the file.
        let now = agentworks_support::clock::now_ms();
        let (before, before_truncated) = match &planned.before {
            Some(content) => {
                let (kept, truncated) = capped_before(content);
                (Some(kept), truncated)
            }
            None => (None, false),
        };
        let mut receipt = Receipt {
            receipt_id: new_receipt_id(),
            request_id: request_id.into(),
            operation,
            project: project.name.clone(),
            path: planned.path.to_string(),
            to_path: planned.to_path.as_ref().map(ToString::to_string),
            user_id: ctx.principal.user_id.clone(),
            user_name: ctx.principal.user_name.clone(),
            connection_id: ctx.principal.connection_id.clone(),
            source: ctx.principal.source.clone(),
            previous_revision: planned.previous.clone(),
            resulting_revision: planned.resulting.clone(),
            state: ReceiptState::Prepared,
            created_at_ms: now,
            updated_at_ms: now,
            payload_hash,
            before_content: before,
            before_truncated,
        };
        if failpoint::hit("receipt_unavailable") == Hit::Fail {
            return Err(WorkspaceError::AuditUnavailable(
                crate::receipts::ReceiptError::Unavailable {
                    path: lock_poisoned(&store).path().to_owned(),
                    source: rusqlite::Error::InvalidQuery,
                },
            ));
        }
        lock_poisoned(&store).insert_prepared(&receipt)?;
        failpoint::hit("after_prepare");
        // 4. Apply.
        if let Err(error) = self.apply(&planned) {
            // Every error of `apply` comes before the rename or unlink: nothing reached the
            // target. Record that (best effort: a prepared receipt left behind is reconciled
            // from the disk later, which gives the same answer).
            if lock_poisoned(&store)
                .set_state(&receipt.receipt_id, ReceiptState::NotApplied)
                .is_err()
            {
                tracing::warn!(receipt = %receipt.receipt_id, "could not mark receipt not_applied; it will be reconciled");
            }
            return Err(error);
        }
        // The target changed. If its folder cannot be synced the change may not survive a
        // crash: leave the receipt prepared (reconciled from the disk later) and say so.
        if let Err(error) = self.sync_after(&planned) {
            return Err(WorkspaceError::Uncertain {
                request_id: request_id.into(),
                reason: format!(
                    "the change reached the file but could not be made durable ({error})"
                ),
                receipt: Box::new(receipt),
            });
        }
        failpoint::hit("before_mark_applied");
        // 5. Applied, audited, answered.
        let marked = match failpoint::hit("mark_applied") {
            Hit::Fail => Err(crate::receipts::ReceiptError::Unavailable {
                path: lock_poisoned(&store).path().to_owned(),
                source: rusqlite::Error::InvalidQuery,
            }),
            Hit::Continue => {
                lock_poisoned(&store).set_state(&receipt.receipt_id, ReceiptState::Applied)
            }
        };
        match marked {
            Ok(updated) => {
                receipt.state = ReceiptState::Applied;
                receipt.updated_at_ms = updated;
            }
            Err(e) => {
                return Err(WorkspaceError::Uncertain {
                    request_id: request_id.into(),
                    reason: format!(
                        "the change was made but its receipt could not be confirmed ({e})"
                    ),
                    receipt: Box::new(receipt),
                });
            }
        }
        audit(&receipt);
        Ok(ChangeResponse {
            state: ReceiptState::Applied,
            replayed: false,
            previous_revision: receipt.previous_revision.clone(),
            revision: receipt.resulting_revision.clone(),
            receipt,
        })
    }

    fn apply(&self, planned: &Planned) -> Result<(), WorkspaceError> {
        let path = &planned.path;
        match &planned.action {
            Action::Replace {
                parent,
                name,
                content,
                existing,
            } => self.replace(
                parent.as_fd(),
                name,
                content,
                existing.as_ref(),
                &planned.previous,
                path,
            ),
            Action::Delete { parent, name, stat } => {
                self.recheck(parent.as_fd(), name, stat, &planned.previous, path)?;
                failpoint_io("before_unlink", path)?;
                rustix::fs::unlinkat(parent, name.as_str(), AtFlags::empty())
                    .map_err(|e| WorkspaceError::io("delete", path, e))
            }
            Action::Move {
                from_parent,
                from_name,
                stat,
                to_parent,
                to_name,
            } => {
                let to = planned.to_path.as_ref().unwrap_or(path);
                self.recheck(
                    from_parent.as_fd(),
                    from_name,
                    stat,
                    &planned.previous,
                    path,
                )?;
                failpoint_io("before_rename", path)?;
                match rustix::fs::renameat_with(
                    from_parent,
                    from_name.as_str(),
                    to_parent,
                    to_name.as_str(),
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => {
                        return Err(WorkspaceError::RevisionConflict {
                            path: to.to_string(),
                            expected: Revision::Missing,
                            current: revision_on_disk(
                                to_parent.as_fd(),
                                &RelPath::parse(to_name)?,
                            )?,
                        });
                    }
                    Err(e) => return Err(WorkspaceError::io("move", path, e)),
                }
                Ok(())
            }
        }
    }

    /// Before replacing or removing `name`, make sure it is still the inode whose revision we
    /// checked and that nobody wrote to it since (an editor outside agentworks takes no lock).
    fn recheck(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        checked: &Stat,
        expected: &Revision,
        path: &RelPath,
    ) -> Result<(), WorkspaceError> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(now) if unchanged_since(&now, checked) => Ok(()),
            _ => Err(WorkspaceError::RevisionConflict {
                path: path.to_string(),
                expected: expected.clone(),
                current: revision_on_disk(parent, &RelPath::parse(name)?)?,
            }),
        }
    }

    /// Stage `content` beside the target, give it the target's ownership and ACLs, fsync it,
    /// re-check the target, rename over it and fsync the folder.
    fn replace(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        content: &[u8],
        existing: Option<&(OwnedFd, Stat)>,
        previous: &Revision,
        path: &RelPath,
    ) -> Result<(), WorkspaceError> {
        let temp_name = format!("{TEMP_PREFIX}{}", hex::encode(rand::random::<[u8; 8]>()));
        // 0o666: the kernel applies the umask, or the folder's default ACL, as for any new file.
        let temp = rustix::fs::openat(
            parent,
            temp_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o666),
        )
        .map_err(|e| match e {
            // The folder was removed after we opened it.
            Errno::NOENT => ConfineError::NotFound {
                path: path.to_string(),
            }
            .into(),
            other => WorkspaceError::io("stage", path, other),
        })?;
        let staged = (|| -> Result<(), WorkspaceError> {
            let mut file = std::fs::File::from(
                temp.try_clone()
                    .map_err(|e| WorkspaceError::io("stage", path, e))?,
            );
            file.write_all(content)
                .map_err(|e| WorkspaceError::io("stage", path, e))?;
            failpoint::hit("after_stage");
            if let Some((original, _)) = existing {
                // Owner/group, then ACL, then mode, all on fds; refuse rather than degrade.
                let ownership = acl::read_ownership(original.as_fd())?;
                acl::carry_over(temp.as_fd(), &ownership)?;
            }
            fsync_fd(temp.as_fd(), "fsync staged file", path)?;
            failpoint_io("before_rename", path)?;
            match existing {
                Some((_, checked)) => {
                    self.recheck(parent, name, checked, previous, path)?;
                    rustix::fs::renameat_with(
                        parent,
                        temp_name.as_str(),
                        parent,
                        name,
                        RenameFlags::empty(),
                    )
                    .map_err(|e| WorkspaceError::io("replace", path, e))
                }
                None => match rustix::fs::renameat_with(
                    parent,
                    temp_name.as_str(),
                    parent,
                    name,
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => Ok(()),
                    Err(Errno::EXIST) => Err(WorkspaceError::RevisionConflict {
                        path: path.to_string(),
                        expected: Revision::Missing,
                        current: revision_on_disk(parent, &RelPath::parse(name)?)?,
                    }),
                    // The folder was removed after we opened it.
                    Err(Errno::NOENT) => Err(ConfineError::NotFound {
                        path: path.to_string(),
                    }
                    .into()),
                    Err(e) => Err(WorkspaceError::io("create", path, e)),
                },
            }
        })();
        if let Err(error) = staged {
            let _ = rustix::fs::unlinkat(parent, temp_name.as_str(), AtFlags::empty());
            return Err(error);
        }
        Ok(())
    }

    /// After the rename or unlink reached the target: make the folder entries durable.
    fn sync_after(&self, planned: &Planned) -> Result<(), WorkspaceError> {
        let path = &planned.path;
        failpoint_io("after_rename", path)?;
        match &planned.action {
            Action::Replace { parent, .. } | Action::Delete { parent, .. } => {
                fsync_fd(parent.as_fd(), "fsync folder", path)?;
            }
            Action::Move {
                from_parent,
                to_parent,
                ..
            } => {
                fsync_fd(to_parent.as_fd(), "fsync folder", path)?;
                fsync_fd(from_parent.as_fd(), "fsync folder", path)?;
            }
        }
        failpoint::hit("after_dir_fsync");
        Ok(())
    }

    /// Decide a prepared receipt from what is on disk and record the decision.
    fn reconcile(
        &self,
        project: &Project,
        store: &Mutex<ReceiptStore>,
        receipt: &mut Receipt,
    ) -> Result<(), WorkspaceError> {
        // What a path holds now; `None` for a file that has gained a second link since: it is
        // not read (its other name may be a file outside the project), so the receipt stays
        // uncertain rather than being decided from it.
        let on_disk = |path: &str| -> Result<Option<Revision>, WorkspaceError> {
            match revision_on_disk(project.root.as_fd(), &RelPath::parse(path)?) {
                Ok(revision) => Ok(Some(revision)),
                Err(WorkspaceError::Confine(ConfineError::HardLink { .. })) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let at_path = on_disk(&receipt.path)?;
        let state = match (&receipt.to_path, at_path) {
            (_, None) => ReceiptState::Uncertain,
            (Some(to), Some(at_path)) => match on_disk(to)? {
                Some(at_to)
                    if at_path == Revision::Missing && at_to == receipt.resulting_revision =>
                {
                    ReceiptState::Applied
                }
                Some(at_to)
                    if at_path == receipt.previous_revision && at_to == Revision::Missing =>
                {
                    ReceiptState::NotApplied
                }
                _ => ReceiptState::Uncertain,
            },
            (None, Some(at_path)) if at_path == receipt.resulting_revision => ReceiptState::Applied,
            (None, Some(at_path)) if at_path == receipt.previous_revision => {
                ReceiptState::NotApplied
            }
            (None, Some(_)) => ReceiptState::Uncertain,
        };
        receipt.updated_at_ms = lock_poisoned(store).set_state(&receipt.receipt_id, state)?;
        receipt.state = state;
        tracing::info!(
            target: audit::TARGET,
            message_id = audit::RECEIPT_RECONCILED,
            agentworks_event = "receipt_reconciled",
            agentworks_user_id = %receipt.user_id,
            agentworks_user_name = %receipt.user_name,
            agentworks_project = %receipt.project,
            agentworks_path = %receipt.path,
            agentworks_request_id = %receipt.request_id,
            agentworks_receipt_id = %receipt.receipt_id,
            agentworks_state = ?state,
            "reconciled an interrupted change"
        );
        if state == ReceiptState::Applied {
            audit(receipt);
        }
        Ok(())
    }

    /// The caller's receipt for a request id, reconciled if it was left prepared.
    pub fn receipt(&self, req: &ReceiptRequest) -> Result<Receipt, WorkspaceError> {
        validate_request_id(&req.request_id)?;
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let store = self.store(&project)?;
        let found = lock_poisoned(&store).find(&req.context.principal.user_id, &req.request_id)?;
        let Some(mut receipt) = found else {
            return Err(WorkspaceError::ReceiptNotFound {
                request_id: req.request_id.clone(),
            });
        };
        if receipt.state == ReceiptState::Prepared {
            self.reconcile(&project, &store, &mut receipt)?;
        }
        Ok(receipt)
    }

    pub fn history(&self, req: &HistoryRequest) -> Result<HistoryResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let path = req.path.as_deref().map(RelPath::parse).transpose()?;
        if let Some(p) = &path {
            guard.check_read(p)?;
        }
        let limit = req.limit.unwrap_or(20).clamp(1, MAX_HISTORY);
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let store = self.store(&project)?;
        let receipts = lock_poisoned(&store).recent(path.as_ref().map(RelPath::as_str), limit)?;
        let readable = |p: &str| RelPath::parse(p).is_ok_and(|p| guard.check_read(&p).is_ok());
        let entries = receipts
            .into_iter()
            .filter(|r| readable(&r.path) && r.to_path.as_deref().is_none_or(readable))
            .map(|mut receipt| {
                let before = receipt
                    .before_content
                    .take()
                    .map(|b| String::from_utf8_lossy(&b).into_owned());
                HistoryEntry {
                    receipt,
                    before_content: before,
                }
            })
            .collect();
        Ok(HistoryResponse { entries })
    }

    /// Create the project folder `name` (one component) under the documents root.
    pub fn ensure_project(
        &self,
        req: &EnsureProjectRequest,
    ) -> Result<EnsureProjectResponse, WorkspaceError> {
        let rel = RelPath::parse(&req.project)?;
        if rel.as_str().contains('/') {
            return Err(WorkspaceError::InvalidRequest(
                "a project folder is one name directly under the documents root".into(),
            ));
        }
        let created =
            match rustix::fs::mkdirat(&self.documents_fd, rel.as_str(), Mode::from_raw_mode(0o777))
            {
                Ok(()) => {
                    fsync_fd(self.documents_fd.as_fd(), "fsync documents root", &rel)?;
                    true
                }
                Err(Errno::EXIST) => false,
                Err(e) => return Err(WorkspaceError::io("create project folder", &rel, e)),
            };
        // It must be a real folder (not a symlink or a file someone put there).
        self.project(rel.as_str())?;
        Ok(EnsureProjectResponse {
            project: rel.to_string(),
            created,
        })
    }

    // ----- start-up -----

    /// Sweep our leftover temp files and reconcile every prepared receipt. Runs before READY.
    pub fn recover(&self) -> Result<RecoveryReport, WorkspaceError> {
        let mut report = RecoveryReport::default();
        let projects = rustix::fs::Dir::read_from(&self.documents_fd).map_err(|e| {
            WorkspaceError::io("list documents root", self.documents_root.display(), e)
        })?;
        let mut names = Vec::new();
        for entry in projects.flatten() {
            if let Ok(name) = entry.file_name().to_str()
                && !name.starts_with('.')
            {
                names.push(name.to_owned());
            }
        }
        for name in names {
            let Ok(project) = self.project(&name) else {
                continue;
            };
            let _lock = self.lock(&project)?;
            report.temp_files_removed += sweep_temp_files(project.root.as_fd(), 0);
            if !self
                .layout
                .receipts_dir(&project.root_path)
                .join("receipts.db")
                .exists()
            {
                continue;
            }
            let store = self.store(&project)?;
            let prepared = lock_poisoned(&store).prepared()?;
            for mut receipt in prepared {
                self.reconcile(&project, &store, &mut receipt)?;
                match receipt.state {
                    ReceiptState::Applied => report.applied += 1,
                    ReceiptState::NotApplied => report.not_applied += 1,
                    _ => report.uncertain += 1,
                }
            }
        }
        Ok(report)
    }
}

/// What start-up recovery found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    pub temp_files_removed: usize,
    pub applied: usize,
    pub not_applied: usize,
    pub uncertain: usize,
}

fn sweep_temp_files(dir: BorrowedFd<'_>, depth: usize) -> usize {
    let Ok(listing) = rustix::fs::Dir::read_from(dir) else {
        return 0;
    };
    let mut removed = 0;
    let mut subdirs = Vec::new();
    for entry in listing.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile
                if name.starts_with(TEMP_PREFIX)
                    && rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() =>
            {
                removed += 1;
            }
            rustix::fs::FileType::Directory if depth + 1 < MAX_WALK_DEPTH => {
                subdirs.push(name.to_owned())
            }
            _ => {}
        }
    }
    for name in subdirs {
        if let Ok(fd) = confine::open_beneath(
            dir,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        ) {
            removed += sweep_temp_files(fd.as_fd(), depth + 1);
        }
    }
    removed
}

/// One structured audit event per applied change, a journal entry with the operation's
/// `MESSAGE_ID` (see [`agentworks_daemon::audit`]) and `AGENTWORKS_*` fields. File contents never enter it.
fn audit(receipt: &Receipt) {
    let message_id = match receipt.operation {
        Operation::Write => audit::WRITE,
        Operation::Patch => audit::PATCH,
        Operation::Move => audit::MOVE,
        Operation::Delete => audit::DELETE,
        Operation::Restore => audit::RESTORE,
    };
    tracing::info!(
        target: audit::TARGET,
        message_id,
        agentworks_event = receipt.operation.as_str(),
        agentworks_user_id = %receipt.user_id,
        agentworks_user_name = %receipt.user_name,
        agentworks_project = %receipt.project,
        agentworks_path = %receipt.path,
        agentworks_to_path = receipt.to_path.as_deref(),
        agentworks_request_id = %receipt.request_id,
        agentworks_receipt_id = %receipt.receipt_id,
        agentworks_previous_revision = %receipt.previous_revision,
        agentworks_resulting_revision = %receipt.resulting_revision,
        agentworks_source = %receipt.source,
        "change applied"
    );
}
