//! The operations of workspaced: read, list, search, write, patch, patch set, edit, move, delete, receipt,
//! history and restore, each for one project and one caller.
//!
//! Every operation runs on a blocking thread, under the project's cross-process lock, on fds
//! opened by `confine`. A change follows one order exactly (the README's "The guarantees"):
//! idempotency check, revision check, *prepared* receipt, stage + fsync + metadata carry-over,
//! identity re-check, rename, directory fsync, *applied* receipt, audit event. If the receipt store cannot record the
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
//!
//! Layout: this file holds the [`Workspace`] itself, opening it and its projects, and the
//! helpers every operation shares; `read.rs` is read, list, search and history; `change.rs`
//! turns each change request into a plan; `edit.rs` is the exact-text edit and its dry run; `exclude.rs` the list's exclude patterns;
//! `patch_set.rs` the multi-file diff with one receipt per file;
//! `pipeline.rs` runs a plan through the ordered steps above; `group_commit.rs` runs the
//! writes and patches queued for one project as one batch through the same steps; `apply.rs` is the part of those
//! steps that touches the tree (stage, re-check, rename or unlink, folder fsync);
//! `recovery.rs` decides interrupted changes from the disk, at start and on request;
//! `sweep.rs` removes our leftover staged files at start and syncs every folder.

mod apply;
mod change;
mod edit;
mod exclude;
mod group_commit;
mod patch_set;
mod pipeline;
mod read;
mod recovery;
mod sweep;

pub use recovery::RecoveryReport;

use crate::error::WorkspaceError;
use crate::lock::{LockError, ProjectLock};
use crate::receipts::ReceiptStore;
use agentworks_contract::workspaced::*;
use agentworks_core::guard::RelPath;
use agentworks_core::revision::Revision;
use agentworks_daemon::layout::{StateLayout, ensure_private_dir, root_key};
use agentworks_fs::confine::{self, ConfineError};
use agentworks_fs::failpoint::{self, Failpoint, Hit};
use rustix::fs::{Mode, OFlags, Stat};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
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
    /// Each project's group-commit queue (`group_commit.rs`), by project name.
    queues: Mutex<HashMap<String, Arc<group_commit::Queue>>>,
    /// The threads that run batches' prepared-receipt transactions (`group_commit.rs`),
    /// started at the first batch.
    helpers: std::sync::OnceLock<group_commit::Helpers>,
}

/// An open project: its folder fd and where its lock and receipts live.
struct Project {
    name: String,
    root: OwnedFd,
    root_path: PathBuf,
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
fn validate_request_id(id: &str) -> Result<(), WorkspaceError> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES || !id.chars().all(|c| c.is_ascii_graphic())
    {
        return Err(WorkspaceError::InvalidRequest(format!(
            "request_id must be 1..={MAX_REQUEST_ID_BYTES} printable ASCII characters without spaces"
        )));
    }
    Ok(())
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
    hash_file(fd, path)
}

/// The revision of an open file's whole content, hashed in blocks without a size limit.
fn hash_file(fd: OwnedFd, path: &RelPath) -> Result<Revision, WorkspaceError> {
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

fn failpoint_io(point: Failpoint, path: &RelPath) -> Result<(), WorkspaceError> {
    match failpoint::hit(point) {
        Hit::Continue => Ok(()),
        Hit::Fail => Err(WorkspaceError::io(
            point.name(),
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
            queues: Mutex::new(HashMap::new()),
            helpers: std::sync::OnceLock::new(),
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
        // Made and its entry synced (or, if that sync failed once, synced now).
        let created = confine::make_dir(self.documents_fd.as_fd(), rel.as_str())
            .map_err(|e| WorkspaceError::io("create project folder", &rel, e))?;
        // It must be a real folder (not a symlink or a file someone put there).
        self.project(rel.as_str())?;
        Ok(EnsureProjectResponse {
            project: rel.to_string(),
            created,
        })
    }
}

#[cfg(test)]
mod tests;
