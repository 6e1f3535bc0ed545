//! The reads: read, stat, list, search and history. They take the project's lock (so they never see
//! a change half-made by another workspaced) and change nothing.
//!
//! They must never follow a symlink, show a dot-entry, or let anything the guard hides reach
//! the caller, not even whether a hidden file matches a search.

use super::exclude::Excludes;
use super::{MAX_HISTORY, MAX_LIST_ENTRIES, MAX_SEARCH_BYTES, MAX_WALK_DEPTH, Project, Workspace};
use super::{hash_file, lock_poisoned, read_bounded};
use crate::error::WorkspaceError;
use agentworks_contract::workspaced::*;
use agentworks_core::guard::{RelPath, ResolvedGuard};
use agentworks_fs::confine::{self, ConfineError};
use rustix::fs::{AtFlags, Stat};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Called by `walk` for every visible entry with its path, kind, stat and parent folder;
/// returns whether to go on.
type WalkVisitor<'a> =
    dyn FnMut(&RelPath, EntryKind, &Stat, BorrowedFd<'_>) -> Result<bool, WorkspaceError> + 'a;

impl Workspace {
    /// `/v1/read`: the whole file, or the lines `offset..offset + limit` of it (see
    /// [`ReadRequest`]); the revision, size and line count are always the whole file's.
    pub fn read(&self, req: &ReadRequest) -> Result<ReadResponse, WorkspaceError> {
        if req.limit == Some(0) {
            return Err(WorkspaceError::InvalidRequest(
                "limit is the most lines to read and is at least 1".into(),
            ));
        }
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
        let total_lines = content.split_inclusive('\n').count() as u64;
        let ranged = req.offset.is_some() || req.limit.is_some();
        let content = if ranged {
            let skip = usize::try_from(req.offset.unwrap_or(0)).unwrap_or(usize::MAX);
            let take = req
                .limit
                .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
            content
                .split_inclusive('\n')
                .skip(skip)
                .take(take)
                .collect()
        } else {
            content
        };
        Ok(ReadResponse {
            path: path.to_string(),
            content,
            revision: current.revision,
            size,
            total_lines,
            offset: ranged.then(|| req.offset.unwrap_or(0)),
            limit: req.limit,
        })
    }

    /// What `path` is: kind, size and revision (files), modification time. The same guard and
    /// confinement as [`Workspace::read`]: a symlink or a file with a second hard link is
    /// refused, never followed or hashed; a missing path is `not_found`.
    pub fn stat(&self, req: &StatRequest) -> Result<StatResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let path = RelPath::parse(&req.path)?;
        guard.check_read(&path)?;
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let not_found = || -> WorkspaceError {
            ConfineError::NotFound {
                path: path.to_string(),
            }
            .into()
        };
        let parent = match confine::open_parent(project.root.as_fd(), &path, false) {
            Ok((parent, _)) => parent,
            Err(ConfineError::NotFound { .. }) | Err(ConfineError::NotADirectory { .. }) => {
                return Err(not_found());
            }
            Err(e) => return Err(e.into()),
        };
        let name = path.file_name();
        let stat = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT) => return Err(not_found()),
            Err(e) => return Err(WorkspaceError::io("stat", &path, e)),
        };
        let (kind, size, revision) = match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile => {
                // Opened as a read opens it: refuses a second hard link, a swap for a symlink.
                let Some((fd, stat)) = confine::open_file(parent.as_fd(), name, &path)? else {
                    return Err(not_found());
                };
                let size = stat.st_size as u64;
                (EntryKind::File, Some(size), Some(hash_file(fd, &path)?))
            }
            rustix::fs::FileType::Directory => (EntryKind::Dir, None, None),
            rustix::fs::FileType::Symlink => {
                return Err(ConfineError::Symlink {
                    path: path.to_string(),
                }
                .into());
            }
            _ => (EntryKind::Other, None, None),
        };
        Ok(StatResponse {
            path: path.to_string(),
            kind,
            size,
            revision,
            // Nanoseconds below one second: the millisecond part always fits.
            modified_ms: stat.st_mtime * 1000 + (stat.st_mtime_nsec / 1_000_000) as i64,
        })
    }

    /// Walk `start` (depth-first, sorted) down to `levels` levels below it (1: its direct
    /// entries; never deeper than `MAX_WALK_DEPTH`), calling `visit` for every entry the guard
    /// lets the caller see and `exclude` does not leave out (an excluded folder is not entered).
    /// Dot-entries are never visited; symlinks are reported as `Other`, never followed.
    fn walk(
        &self,
        project: &Project,
        guard: &ResolvedGuard,
        start: Option<&RelPath>,
        levels: usize,
        exclude: &Excludes,
        visit: &mut WalkVisitor<'_>,
    ) -> Result<(), WorkspaceError> {
        let levels = levels.min(MAX_WALK_DEPTH);
        // Where entry paths start below `start`, for the patterns that match from there.
        let start_len = start.map(|p| p.as_str().len() + 1).unwrap_or(0);
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
                if exclude.excludes(rel.as_str().get(start_len..).unwrap_or_default()) {
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
                if kind == EntryKind::Dir && depth + 1 < levels {
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

    /// `/v1/list`: the entries below `path`, to `depth` levels, without the `exclude`d ones,
    /// at most `max_entries` (see [`ListRequest`]).
    pub fn list(&self, req: &ListRequest) -> Result<ListResponse, WorkspaceError> {
        let levels = match (req.depth, req.recursive) {
            (Some(0), _) => {
                return Err(WorkspaceError::InvalidRequest(
                    "depth counts levels below path and is at least 1".into(),
                ));
            }
            (Some(depth), _) => depth,
            (None, true) => MAX_WALK_DEPTH,
            (None, false) => 1,
        };
        let exclude = Excludes::parse(&req.exclude)?;
        let max_entries = req
            .max_entries
            .unwrap_or(MAX_LIST_ENTRIES)
            .clamp(1, MAX_LIST_ENTRIES);
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
            levels,
            &exclude,
            &mut |rel, kind, stat, _| {
                if entries.len() >= max_entries {
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
            MAX_WALK_DEPTH,
            &Excludes::default(),
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
}
