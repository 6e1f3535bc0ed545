//! Patches on the laptop: `diff_patch_workspace_file` applied inside a write folder, or inside
//! its Downloads companion, under the same Landlock sandbox as commands.
//!
//! Owns: the hidden `agentworks __apply-patch <folder>` mode ([`apply_main`]) and the
//! executor-side [`run`] that launches it through the sandbox crate as
//! `agentworks __sandbox-exec <policy> -- agentworks __apply-patch <folder>` with the job
//! ([`PatchJob`]: the diff, the folder's guard, the Downloads companion and its guard) on stdin
//! and the [`Outcome`] as JSON on stdout.
//!
//! Why a re-exec and not a forked child: the sandbox crate's ruleset building is private to
//! its launcher, and a fork of the multi-threaded tokio executor could only safely exec anyway;
//! the launcher already forks, confines and reaps, so the applier is just another program it
//! runs. The executable itself is granted read/execute in the policy (it may live outside the
//! system paths, e.g. in a build tree).
//!
//! The applier splits the diff into files ([`agentworks_core::patch::split_files`]) and validates EVERY
//! file before changing any, in this order:
//!
//! 1. The folder. `filepath` chooses it: a relative path, or an absolute one inside the bound
//!    folder, is in the bound folder; an absolute path inside the Downloads folder (when the
//!    executor shares `--downloads`) is in Downloads, under Downloads' own guard; an absolute
//!    path anywhere else is refused (`outside_folder`). Relative paths in the diff's headers are
//!    relative to that folder, and an absolute one must lie in it: a patch never spans two
//!    folders (`patch_rejected`).
//! 2. The names. The diff must name `filepath` (or have no file headers, and then it is applied
//!    to `filepath`); a diff that names only other files is `patch_rejected` with both names, so
//!    the file a person sees named in the call is a file the patch changes. The files together
//!    must be able to follow each other ([`agentworks_core::set_effect`]): one that creates
//!    `x` and another that needs `x/` as a folder is `patch_rejected` here, not found half way
//!    through the writes.
//! 3. Each file: a [`RelPath`] inside the folder, allowed by the folder's guard (not blocked, not
//!    read-only, not `workflow.json`/`product.json`; read-only projects nested in the folder stay
//!    read-only), opened with `openat2` beneath the folder (no symlink anywhere, no escape), a
//!    regular UTF-8 file with a single link (a second hard link may be a file outside every
//!    shared folder: `path_refused`, reason `hard_link`) or missing, for a `/dev/null`
//!    creation, and its hunks match strictly.
//!
//! Only then does it write each file (temp file, fsync, rename, fsync of the folder). A new file
//! is created with mode 0666 less the umask the executor started with (inherited through the
//! launcher), as a shell creates one; an existing file keeps its mode. Renames and deletions are
//! refused.
//!
//! Must never: change a file when any file of the diff fails validation; follow a symlink;
//! read or write through a file with a second hard link; write outside the chosen folder, or in
//! two folders; make a new file more permissive than the umask allows.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{Mode, OFlags, Stat};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use agentworks_contract::executor::{Outcome, PatchedFile};
use agentworks_core::guard::{Guard, RelPath, ResolvedGuard};
use agentworks_core::revision::Revision;
use agentworks_core::set_effect::{self, Change, Names};
use agentworks_fs::confine::{self, ConfineError};
use agentworks_fs::staged::StagedFile;

use super::grants::{Folder, Grants};
use agentworks_sandbox::process::{Launcher, SandboxCommand, SandboxedChild, SpawnError, Stream};
use agentworks_sandbox::{REFUSAL_PREFIX, SandboxPolicy};

/// The hidden subcommand of the applier.
pub const SUBCOMMAND: &str = "__apply-patch";
/// How long the applier may take.
const PATCH_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest file a patch may change.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What the applier gets on stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchJob {
    pub filepath: String,
    pub diff: String,
    /// The guard of the folder the request is bound to.
    pub guard: Guard,
    /// The Downloads companion, when the executor shares `--downloads`.
    #[serde(default)]
    pub downloads: Option<DownloadsCompanion>,
    /// `--allow-project-config`: the protected project config may be patched.
    #[serde(default)]
    pub allow_project_config: bool,
}

/// `~/Downloads` as a patch sees it: its canonical path and its own guard.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadsCompanion {
    pub path: PathBuf,
    pub guard: Guard,
}

impl PatchJob {
    /// The job for a patch sent to `folder`: its guard and, when `--downloads` followed it, the
    /// Downloads folder with its own guard.
    pub fn new(grants: &Grants, folder: &Folder, filepath: String, diff: String) -> PatchJob {
        PatchJob {
            filepath,
            diff,
            guard: grants.guard(folder),
            downloads: grants
                .downloads_of(folder)
                .map(Path::to_path_buf)
                .zip(grants.downloads_guard())
                .map(|(path, guard)| DownloadsCompanion { path, guard }),
            allow_project_config: false,
        }
    }
}

fn refused(code: &str, message: impl Into<String>) -> Outcome {
    Outcome::Refused {
        code: code.to_owned(),
        message: message.into(),
    }
}

fn confine_refusal(error: ConfineError) -> Outcome {
    let code = match &error {
        ConfineError::Symlink { .. } => "symlink",
        ConfineError::Escape { .. } => "outside_folder",
        ConfineError::NotFound { .. } => "not_found",
        ConfineError::NotAFile { .. } | ConfineError::NotADirectory { .. } => "not_a_file",
        // The refusal travels as {code, message}; the reason leads the message.
        ConfineError::HardLink { .. } => {
            return refused("path_refused", format!("hard_link: {error}"));
        }
        ConfineError::Io { .. } => "io_error",
    };
    refused(code, error.to_string())
}

/// Hidden-mode entry: read the job from stdin, apply it in `folder` (the process is already
/// sandboxed), print the outcome as JSON. Returns the process exit code.
pub fn apply_main(args: &[String]) -> i32 {
    let outcome = match args {
        [folder] => {
            let mut input = String::new();
            match std::io::stdin().read_to_string(&mut input) {
                Ok(_) => match serde_json::from_str::<PatchJob>(&input) {
                    Ok(job) => apply_in(Path::new(folder), &job),
                    Err(e) => refused("bad_job", format!("the patch job does not parse: {e}")),
                },
                Err(e) => refused("bad_job", format!("cannot read the patch job: {e}")),
            }
        }
        _ => refused("bad_job", format!("usage: {SUBCOMMAND} <folder>")),
    };
    match serde_json::to_string(&outcome) {
        Ok(text) => {
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{text}").and_then(|()| out.flush()).is_ok() {
                0
            } else {
                1
            }
        }
        Err(_) => 1,
    }
}

/// A patch never changes a folder's protected project config (`project_config.rs`: the files
/// and git configs that make the person's tools run a program), which a command's changes are
/// undone in: a refusal when `filepath` or a file the diff names is in the protected set of the
/// folder or of its Downloads companion. Most of the set has a dot component and is out of a
/// patch's reach anyway; this catches the rest (a `core.hooksPath` folder, an included config).
async fn refuse_protected_project_config(folder: &Path, job: &PatchJob) -> Option<Outcome> {
    if job.allow_project_config {
        return None;
    }
    let mut named: Vec<PathBuf> = vec![PathBuf::from(&job.filepath)];
    if let Ok(files) = agentworks_core::patch::split_files(&job.diff) {
        for file in files {
            named.extend(
                file.old_path
                    .into_iter()
                    .chain(file.new_path)
                    .map(PathBuf::from),
            );
        }
    }
    let named: Vec<PathBuf> = named
        .into_iter()
        .map(|p| if p.is_absolute() { p } else { folder.join(p) })
        .collect();
    let mut roots = vec![folder.to_owned()];
    roots.extend(job.downloads.as_ref().map(|d| d.path.clone()));
    let found = tokio::task::spawn_blocking(move || {
        roots.iter().find_map(|root| {
            let snapshot = crate::project_config::Snapshot::take(root, "").ok()?;
            named.iter().find(|p| snapshot.contains(p)).cloned()
        })
    })
    .await
    .ok()
    .flatten()?;
    Some(refused(
        "protected_project_config",
        format!(
            "{} makes your tools run a program (git hooks and config, editor tasks, the coding \
             CLIs' project config); patches do not change it unless the executor was started \
             with --allow-project-config",
            found.display()
        ),
    ))
}

/// One validated file, ready to write.
struct Planned {
    path: RelPath,
    /// How the outcome names it: folder-relative in the bound folder, absolute in Downloads.
    shown: String,
    content: String,
    /// The file as validated (its mode is kept, its identity re-checked before an in-place
    /// write); `None` for a new file.
    existing: Option<Stat>,
}

/// A folder a patch may change files in.
#[derive(Clone, Copy)]
struct PatchRoot<'a> {
    /// Canonical.
    path: &'a Path,
    guard: &'a Guard,
    is_downloads: bool,
}

impl PatchRoot<'_> {
    fn name(&self) -> &'static str {
        if self.is_downloads {
            "the Downloads folder"
        } else {
            "the shared folder"
        }
    }
}

/// The folder a patch applies in, chosen by its `filepath`, and how the diff's paths are read.
struct Target<'a> {
    /// The chosen folder.
    root: PatchRoot<'a>,
    /// Every folder a path may name: the bound folder, then Downloads (when shared).
    roots: Vec<PatchRoot<'a>>,
    /// `filepath` as sent, for messages.
    filepath_raw: &'a str,
    /// `filepath` inside the chosen folder.
    filepath: RelPath,
}

impl<'a> Target<'a> {
    fn choose(folder: &'a Path, job: &'a PatchJob) -> Result<Target<'a>, Outcome> {
        let bound = PatchRoot {
            path: folder,
            guard: &job.guard,
            is_downloads: false,
        };
        let mut roots = vec![bound];
        if let Some(downloads) = &job.downloads {
            roots.push(PatchRoot {
                path: &downloads.path,
                guard: &downloads.guard,
                is_downloads: true,
            });
        }
        let raw = job.filepath.as_str();
        let root = if Path::new(raw).is_absolute() {
            containing(&roots, Path::new(raw)).ok_or_else(|| outside(raw, &roots))?
        } else {
            bound
        };
        let filepath = inside(root, raw)?;
        Ok(Target {
            root,
            roots,
            filepath_raw: raw,
            filepath,
        })
    }

    /// A path from the diff's headers, inside the chosen folder.
    fn locate(&self, raw: &str) -> Result<RelPath, Outcome> {
        if !Path::new(raw).is_absolute() {
            return RelPath::parse(raw).map_err(|e| refused("invalid_path", e.to_string()));
        }
        match containing(&self.roots, Path::new(raw)) {
            Some(root) if root.is_downloads == self.root.is_downloads => inside(root, raw),
            Some(other) => Err(refused(
                "patch_rejected",
                format!(
                    "the diff names {raw}, in {}, but filepath {} is in {}; a patch changes files \
                     in one folder only: send one patch per folder",
                    other.name(),
                    self.filepath_raw,
                    self.root.name()
                ),
            )),
            None => Err(outside(raw, &self.roots)),
        }
    }

    /// How the outcome names `path`.
    fn shown(&self, path: &RelPath) -> String {
        if self.root.is_downloads {
            self.root
                .path
                .join(path.as_str())
                .to_string_lossy()
                .into_owned()
        } else {
            path.to_string()
        }
    }
}

/// The folder an absolute path lies in: the deeper one when both hold it (a project nested in
/// Downloads keeps its own guard), the bound folder when they are the same.
fn containing<'a>(roots: &[PatchRoot<'a>], path: &Path) -> Option<PatchRoot<'a>> {
    roots
        .iter()
        .filter(|root| path.starts_with(root.path))
        .max_by_key(|root| (root.path.components().count(), !root.is_downloads))
        .copied()
}

/// `raw` (relative, or absolute inside `root`) as a path inside `root`. Components are compared,
/// not strings; a `..` left after the prefix is refused by [`RelPath::parse`].
fn inside(root: PatchRoot<'_>, raw: &str) -> Result<RelPath, Outcome> {
    let stripped = Path::new(raw)
        .strip_prefix(root.path)
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    RelPath::parse(stripped.as_deref().unwrap_or(raw))
        .map_err(|e| refused("invalid_path", e.to_string()))
}

fn outside(raw: &str, roots: &[PatchRoot<'_>]) -> Outcome {
    let names: Vec<&str> = roots.iter().map(PatchRoot::name).collect();
    refused(
        "outside_folder",
        format!(
            "{raw} is outside {}; a patch changes files inside them only",
            names.join(" and ")
        ),
    )
}

/// Why one planned file could not be written; its message is the start of the
/// `write_failed`/`partially_applied` refusal the executor sends.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// Its folder could not be opened (or made) beneath the root.
    #[error(transparent)]
    Parent(#[from] ConfineError),
    /// No temp file could be made beside it.
    #[error("cannot create a temp file beside {path}: {source}")]
    TempFile {
        path: RelPath,
        source: std::io::Error,
    },
    /// Opening, writing, syncing or renaming it failed.
    #[error("cannot write {path}: {source}")]
    Write {
        path: RelPath,
        source: std::io::Error,
    },
    /// The file rewritten in place is no longer the one validated (or has a second link).
    #[error(
        "{path} was replaced or linked elsewhere after it was validated; nothing was written to it"
    )]
    Replaced { path: RelPath },
}

impl WriteError {
    fn write(path: &RelPath, source: impl Into<std::io::Error>) -> WriteError {
        WriteError::Write {
            path: path.clone(),
            source: source.into(),
        }
    }
}

/// Rewrite an existing file where it is, for a folder in which no temp file can be made. The
/// name is opened again, so the file must still be the one validated, with a single link,
/// before it is truncated: a file swapped in meanwhile (a hard link to a file elsewhere, a
/// FIFO) is refused untouched.
fn write_in_place(
    dir: &std::os::fd::OwnedFd,
    name: &str,
    planned: &Planned,
) -> Result<(), WriteError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| WriteError::write(&planned.path, e))?;
    let now = rustix::fs::fstat(&fd).map_err(|e| WriteError::write(&planned.path, e))?;
    let same = planned
        .existing
        .as_ref()
        .is_some_and(|was| was.st_dev == now.st_dev && was.st_ino == now.st_ino);
    if !same || now.st_nlink != 1 {
        return Err(WriteError::Replaced {
            path: planned.path.clone(),
        });
    }
    let mut file = std::fs::File::from(fd);
    file.set_len(0)
        .and_then(|()| file.write_all(planned.content.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|e| WriteError::write(&planned.path, e))
}

/// Validate every file, then apply every file. The process is expected to be sandboxed already.
pub fn apply_in(folder: &Path, job: &PatchJob) -> Outcome {
    match validate(folder, job) {
        Ok((root, plan)) => write_all(&root, plan),
        Err(outcome) => outcome,
    }
}

/// One file's part of the diff, named inside the chosen folder.
struct Named {
    /// `None` for a creation (`--- /dev/null`).
    old: Option<RelPath>,
    new: RelPath,
    text: String,
}

/// Every check of the module doc, in its order, before any file is changed: the folder (from
/// `filepath`), every file's name, then every file's guard, content and hunks.
fn validate(
    folder: &Path,
    job: &PatchJob,
) -> Result<(std::os::fd::OwnedFd, Vec<Planned>), Outcome> {
    // 1. The folder, from filepath.
    let target = Target::choose(folder, job)?;
    let guard = target
        .root
        .guard
        .resolve()
        .map_err(|e| refused("invalid_guard", e.to_string()))?;
    // 2. Every file's name, before any file is opened.
    let named = name_files(&target, &job.diff)?;
    // 3. Every file's guard, content and hunks.
    let root = open_root(&target)?;
    let mut plan: Vec<Planned> = Vec::new();
    for file in named {
        plan.push(plan_file(&root, &guard, &target, file)?);
    }
    Ok((root, plan))
}

/// Step 2: split the diff into its files and name each inside the chosen folder. Deletions,
/// renames and a file named twice are refused, and the diff must name `filepath`.
fn name_files(target: &Target<'_>, diff: &str) -> Result<Vec<Named>, Outcome> {
    let parts = agentworks_core::patch::split_files(diff)
        .map_err(|e| refused("invalid_diff", e.to_string()))?;
    let mut named: Vec<Named> = Vec::new();
    for part in parts {
        let file = name_file(target, part)?;
        if named.iter().any(|n| n.new == file.new) {
            return Err(refused(
                "invalid_diff",
                format!("{} appears twice in the diff", file.new),
            ));
        }
        named.push(file);
    }
    require_filepath_named(target, &named)?;
    let changes: Vec<Change<'_>> = named
        .iter()
        .map(|n| match n.old {
            None => Change::Create(&n.new),
            Some(_) => Change::Modify(&n.new),
        })
        .collect();
    // APFS, macOS's default, compares names without case: `A.txt` and `a.txt` are one file.
    let names = if cfg!(target_os = "macos") {
        Names::CaseInsensitive
    } else {
        Names::Exact
    };
    set_effect::check_set(&changes, names).map_err(|e| refused("patch_rejected", e.to_string()))?;
    Ok(named)
}

/// One file's part of the diff, named inside the chosen folder; a deletion or a rename is
/// refused.
fn name_file(
    target: &Target<'_>,
    part: agentworks_core::patch::FileDiff,
) -> Result<Named, Outcome> {
    let (old, new) = match (&part.old_path, &part.new_path) {
        // A diff without file headers is the diff of filepath.
        (None, None) => (Some(target.filepath.clone()), target.filepath.clone()),
        (_, None) => {
            return Err(refused(
                "unsupported",
                "deleting files by patch is not supported; use a command",
            ));
        }
        (old, Some(new)) => (
            old.as_deref().map(|o| target.locate(o)).transpose()?,
            target.locate(new)?,
        ),
    };
    if let Some(old) = &old
        && *old != new
    {
        return Err(refused(
            "unsupported",
            format!("renaming {old} to {new} by patch is not supported; use a command"),
        ));
    }
    Ok(Named {
        old,
        new,
        text: part.text,
    })
}

/// The file a person sees named in the call must be a file the patch changes.
fn require_filepath_named(target: &Target<'_>, named: &[Named]) -> Result<(), Outcome> {
    if named.iter().any(|n| n.new == target.filepath) {
        return Ok(());
    }
    let names: Vec<String> = named.iter().map(|n| target.shown(&n.new)).collect();
    Err(refused(
        "patch_rejected",
        format!(
            "the diff changes {} but filepath is {}; send a diff that names {} (or one \
             without file headers)",
            names.join(", "),
            target.filepath_raw,
            target.filepath_raw
        ),
    ))
}

/// The chosen folder, opened as the anchor every file is opened beneath.
fn open_root(target: &Target<'_>) -> Result<std::os::fd::OwnedFd, Outcome> {
    rustix::fs::open(
        target.root.path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        refused(
            "folder_unavailable",
            format!("cannot open {}: {e}", target.root.name()),
        )
    })
}

/// Step 3 for one file: its guard, then its current content, then its hunks.
fn plan_file(
    root: &std::os::fd::OwnedFd,
    guard: &ResolvedGuard,
    target: &Target<'_>,
    Named {
        old,
        new: path,
        text,
    }: Named,
) -> Result<Planned, Outcome> {
    guard
        .check_write(&path)
        .map_err(|e| refused(e.reason(), e.to_string()))?;
    let (base, existing) = read_current(root, &path, old.is_none())?;
    let base = match (base, &old) {
        (Some(text), Some(_)) => text,
        (None, None) => String::new(),
        (Some(_), None) => {
            return Err(refused(
                "already_exists",
                format!("{path} already exists; diff against its current content"),
            ));
        }
        (None, Some(_)) => {
            return Err(refused("not_found", format!("{path} does not exist")));
        }
    };
    let content = agentworks_core::patch::apply_strict(&base, &text)
        .map_err(|e| refused("patch_mismatch", format!("{path}: {e}")))?;
    Ok(Planned {
        shown: target.shown(&path),
        path,
        content,
        existing,
    })
}

/// The file's text and identity, opened beneath `root` without following a symlink (a
/// regular file with one link, at most [`MAX_FILE_BYTES`], UTF-8), or `(None, None)` when it
/// is missing. For a creation (`is_creation`) its parent folders may be missing too.
fn read_current(
    root: &std::os::fd::OwnedFd,
    path: &RelPath,
    is_creation: bool,
) -> Result<(Option<String>, Option<Stat>), Outcome> {
    match confine::open_parent(root.as_fd(), path, false) {
        Ok((dir, name)) => match confine::open_file(dir.as_fd(), name, path) {
            Ok(Some((fd, stat))) => {
                if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > MAX_FILE_BYTES {
                    return Err(refused(
                        "too_large",
                        format!("{path} is too large to patch"),
                    ));
                }
                let mut bytes = Vec::new();
                std::fs::File::from(fd)
                    .read_to_end(&mut bytes)
                    .map_err(|e| refused("io_error", format!("cannot read {path}: {e}")))?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| refused("not_text", format!("{path} is not UTF-8 text")))?;
                Ok((Some(text), Some(stat)))
            }
            Ok(None) => Ok((None, None)),
            Err(e) => Err(confine_refusal(e)),
        },
        // A new file may create its missing parent folders.
        Err(ConfineError::NotFound { .. }) if is_creation => Ok((None, None)),
        Err(e) => Err(confine_refusal(e)),
    }
}

fn write_one(root: &std::os::fd::OwnedFd, planned: &Planned) -> Result<(), WriteError> {
    let (dir, name) = confine::open_parent(root.as_fd(), &planned.path, true)?;
    // An existing file keeps its mode. A new one is created 0666 and left as the kernel makes
    // it: less the umask (inherited from the executor through the launcher) or as the folder's
    // default ACL says, exactly as a shell's `>` would create it. Never chmod-ed afterwards.
    // st_mode is u32 on Linux, u16 on macOS; the cast only widens.
    #[allow(clippy::unnecessary_cast)]
    let kept_mode = planned
        .existing
        .as_ref()
        .map(|stat| stat.st_mode as u32 & 0o7777);
    let mut staged = match StagedFile::create(
        dir.as_fd(),
        ".agentworks-patch-",
        kept_mode.unwrap_or(0o666),
    ) {
        Ok(staged) => staged,
        // The sandbox grants a folder that lies on the path to a --block/--read-only
        // exclusion only its existing entries, so no temp file can be made there: an
        // existing file is then rewritten in place (validated already; not atomic against
        // a crash).
        Err(rustix::io::Errno::ACCESS) if planned.existing.is_some() => {
            return write_in_place(&dir, name, planned);
        }
        Err(e) => {
            return Err(WriteError::TempFile {
                path: planned.path.clone(),
                source: e.into(),
            });
        }
    };
    // An error at any step drops `staged`, which unlinks the temp file.
    let written = staged
        .write_all(planned.content.as_bytes())
        .and_then(|()| match kept_mode {
            Some(mode) => {
                // mode_t is u16 on macOS; a mode from st_mode & 0o7777 always fits.
                let raw = rustix::fs::RawMode::try_from(mode)
                    .map_err(|_| std::io::Error::from(rustix::io::Errno::INVAL))?;
                rustix::fs::fchmod(staged.fd(), Mode::from_raw_mode(raw)).map_err(Into::into)
            }
            None => Ok(()),
        })
        .and_then(|()| staged.sync().map_err(Into::into));
    written
        .and_then(|()| staged.rename_to(name, false).map_err(Into::into))
        .and_then(|()| rustix::fs::fsync(&dir).map_err(Into::into))
        .map_err(|e: std::io::Error| WriteError::write(&planned.path, e))
}

fn write_all(root: &std::os::fd::OwnedFd, plan: Vec<Planned>) -> Outcome {
    let mut files = Vec::new();
    for planned in &plan {
        if let Err(error) = write_one(root, planned) {
            let changed: Vec<&str> = files
                .iter()
                .map(|f: &PatchedFile| f.path.as_str())
                .collect();
            return refused(
                if changed.is_empty() {
                    "write_failed"
                } else {
                    "partially_applied"
                },
                format!("{error}; files already changed: [{}]", changed.join(", ")),
            );
        }
        files.push(PatchedFile {
            path: planned.shown.clone(),
            revision: Revision::of(planned.content.as_bytes()).to_string(),
        });
    }
    Outcome::Patched { files }
}

/// Apply `job` in `folder` through the sandbox launcher (`launcher` is the `agentworks`
/// executable). The policy is the folder's command policy plus read/execute on the launcher.
pub async fn run(
    launcher: &Path,
    policy: &SandboxPolicy,
    folder: &Path,
    job: &PatchJob,
) -> Outcome {
    if let Some(refusal) = refuse_protected_project_config(folder, job).await {
        return refusal;
    }
    let mut policy = policy.clone();
    policy.read_only.push(launcher.to_owned());
    let job_json = match serde_json::to_vec(job) {
        Ok(json) => json,
        Err(e) => return refused("internal", e.to_string()),
    };
    let child = match applier_command(launcher, policy, folder).spawn(&Launcher::at(launcher)) {
        Ok(child) => child,
        Err(SpawnError::Policy(e)) => return refused("internal", e.to_string()),
        Err(SpawnError::Launcher { source, .. }) => {
            return refused(
                "sandbox_unavailable",
                format!("cannot start the launcher: {source}"),
            );
        }
    };
    let Ok((status, out, err)) =
        tokio::time::timeout(PATCH_TIMEOUT, exchange_with_applier(child, &job_json)).await
    else {
        return refused(
            "timeout",
            "the patch did not finish in time; inspect the files before retrying",
        );
    };
    read_outcome(status, &out, &err)
}

/// `agentworks __sandbox-exec <policy> -- agentworks __apply-patch <folder>`, with only `PATH`
/// in its environment and its three streams piped (the launcher starts in its own session,
/// dying with the executor, holding the policy's pinned fds; a handle dropped on a timeout ends
/// the applier's tree).
fn applier_command(launcher: &Path, policy: SandboxPolicy, folder: &Path) -> SandboxCommand {
    let mut command = SandboxCommand::new(launcher, policy);
    command
        .arg(SUBCOMMAND)
        .arg(folder)
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stream::Piped)
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    command
}

/// Write the job to the applier's stdin and close it, read its stdout (up to 8 MiB) and stderr
/// (up to 64 KiB), and reap it. The caller bounds the whole exchange in time.
async fn exchange_with_applier(
    mut child: SandboxedChild,
    job_json: &[u8],
) -> (std::io::Result<std::process::ExitStatus>, Vec<u8>, Vec<u8>) {
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    if let Some(mut pipe) = stdin.take() {
        let _ = pipe.write_all(job_json).await;
        drop(pipe);
    }
    let mut out = Vec::new();
    let mut err = Vec::new();
    if let Some(pipe) = stdout.as_mut() {
        let _ = pipe.take(8 * 1024 * 1024).read_to_end(&mut out).await;
    }
    if let Some(pipe) = stderr.as_mut() {
        let _ = pipe.take(64 * 1024).read_to_end(&mut err).await;
    }
    let status = child.wait().await;
    (status, out, err)
}

/// The applier's outcome: a launcher refusal on stderr first (the sandbox could not be set up,
/// so nothing ran), else the JSON on stdout, else a failure with the exit status and stderr.
fn read_outcome(
    status: std::io::Result<std::process::ExitStatus>,
    out: &[u8],
    err: &[u8],
) -> Outcome {
    let err = String::from_utf8_lossy(err);
    if let Some(reason) = err.strip_prefix(REFUSAL_PREFIX) {
        return refused(
            "sandbox_unavailable",
            format!("the patch was not applied: {}", reason.trim_end()),
        );
    }
    match serde_json::from_slice::<Outcome>(out) {
        Ok(outcome) => outcome,
        Err(_) => refused(
            "patch_failed",
            format!(
                "the patch applier failed ({}): {}",
                status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string()),
                err.trim_end()
            ),
        ),
    }
}

/// A per-request scratch dir under the CLI's state dir (0700).
pub fn scratch_dir(root: &Path, request_id: &str) -> PathBuf {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(request_id.as_bytes()));
    root.join(format!(
        "{}-{}",
        &digest[..16],
        hex::encode(rand::random::<[u8; 4]>())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn job(diff: &str) -> PatchJob {
        PatchJob {
            filepath: "a.txt".into(),
            diff: diff.into(),
            guard: Guard {
                write_paths: vec![String::new()],
                blocked_paths: vec!["secret".into()],
                read_only_paths: vec!["ro".into()],
                ..Guard::default()
            },
            downloads: None,
            allow_project_config: false,
        }
    }

    fn refusal(outcome: &Outcome) -> (&str, &str) {
        match outcome {
            Outcome::Refused { code, message } => (code.as_str(), message.as_str()),
            other => panic!("not refused: {other:?}"),
        }
    }

    fn patched_paths(outcome: &Outcome) -> Vec<&str> {
        match outcome {
            Outcome::Patched { files } => files.iter().map(|f| f.path.as_str()).collect(),
            other => panic!("not patched: {other:?}"),
        }
    }

    #[test]
    fn validates_every_file_before_changing_any() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("a.txt"), "one\ntwo\n").expect("write");
        std::fs::create_dir(root.join("ro")).expect("mkdir");
        std::fs::write(root.join("ro/b.txt"), "x\n").expect("write");
        std::os::unix::fs::symlink("/etc", root.join("link")).expect("symlink");
        let good = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+ONE\n";
        for bad_second in [
            "--- a/ro/b.txt\n+++ b/ro/b.txt\n@@ -1 +1 @@\n-x\n+y\n",
            "--- a/link/passwd\n+++ b/link/passwd\n@@ -1 +1 @@\n-x\n+y\n",
            "--- /dev/null\n+++ b/secret\n@@ -0,0 +1 @@\n+s\n",
            "--- /dev/null\n+++ b/workflow.json\n@@ -0,0 +1 @@\n+{}\n",
            "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-x\n+y\n",
            // Control and bidirectional formatting characters in a name (issue 42, item 9).
            "--- /dev/null\n+++ b/run\u{202e}txt.sh\n@@ -0,0 +1 @@\n+s\n",
            "--- /dev/null\n+++ b/a\x1b[2Jb.txt\n@@ -0,0 +1 @@\n+s\n",
        ] {
            let outcome = apply_in(root, &job(&format!("{good}{bad_second}")));
            assert!(matches!(outcome, Outcome::Refused { .. }), "{outcome:?}");
            assert_eq!(
                std::fs::read_to_string(root.join("a.txt")).expect("read"),
                "one\ntwo\n"
            );
        }
        let new = "--- /dev/null\n+++ b/sub/new.txt\n@@ -0,0 +1 @@\n+n\n";
        let outcome = apply_in(root, &job(&format!("{good}{new}")));
        let Outcome::Patched { files } = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].revision, Revision::of(b"ONE\ntwo\n").to_string());
        assert_eq!(
            std::fs::read_to_string(root.join("sub/new.txt")).expect("read"),
            "n\n"
        );
        // A headerless diff names its file by filepath.
        let outcome = apply_in(root, &job("@@ -2 +2 @@\n-two\n+TWO\n"));
        assert!(matches!(outcome, Outcome::Patched { .. }), "{outcome:?}");
    }

    /// Issue 42 item 8: a file created as `x` and another created as `x/y.txt` were each
    /// valid, and the second failed after the first was written (`partially_applied`).
    #[test]
    fn a_patch_whose_files_cannot_follow_each_other_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("a.txt"), "one\n").expect("write");
        let good = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+ONE\n";
        let x = "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+x\n";
        let x_y = "--- /dev/null\n+++ b/x/y.txt\n@@ -0,0 +1 @@\n+y\n";
        for diff in [format!("{good}{x}{x_y}"), format!("{x_y}{good}{x}")] {
            let outcome = apply_in(root, &job(&diff));
            let (code, message) = refusal(&outcome);
            assert_eq!(code, "patch_rejected", "{message}");
            assert!(message.contains("cannot be both"), "{message}");
            assert_eq!(
                std::fs::read_to_string(root.join("a.txt")).expect("read"),
                "one\n"
            );
            assert!(!root.join("x").exists());
        }
    }

    #[test]
    fn a_diff_must_name_filepath_or_have_no_headers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::write(root.join("a.txt"), "one\n").expect("write");
        std::fs::create_dir(root.join("src")).expect("mkdir");
        std::fs::write(root.join("src/main.py"), "print(1)\n").expect("write");
        let other = "--- a/src/main.py\n+++ b/src/main.py\n@@ -1 +1 @@\n-print(1)\n+print(2)\n";
        let outcome = apply_in(root, &job(other));
        let (code, message) = refusal(&outcome);
        assert_eq!(code, "patch_rejected");
        assert!(
            message.contains("src/main.py") && message.contains("a.txt"),
            "{message}"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("src/main.py")).expect("read"),
            "print(1)\n"
        );
        // Naming filepath among other files is a multi-file patch of filepath.
        let both = format!("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+ONE\n{other}");
        assert_eq!(
            patched_paths(&apply_in(root, &job(&both))),
            ["a.txt", "src/main.py"]
        );
        // filepath may be absolute inside the folder; headers relative.
        let mut absolute = job("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-ONE\n+1\n");
        absolute.filepath = root.join("a.txt").to_string_lossy().into_owned();
        assert_eq!(patched_paths(&apply_in(root, &absolute)), ["a.txt"]);
    }

    #[test]
    fn refuses_a_file_with_a_second_hard_link_and_keeps_modes() {
        let outside = tempfile::tempdir().expect("tempdir");
        let key = outside.path().join("authorized_keys");
        std::fs::write(&key, "ssh-ed25519 AAAA person\n").expect("write");
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::hard_link(&key, root.join("a.txt")).expect("link");
        let append = "--- a/a.txt\n+++ b/a.txt\n@@ -1,0 +2 @@\n+ssh-ed25519 BBBB attacker\n";
        let outcome = apply_in(root, &job(append));
        let (code, message) = refusal(&outcome);
        assert_eq!(code, "path_refused");
        assert!(message.starts_with("hard_link: "), "{message}");
        assert_eq!(
            std::fs::read_to_string(&key).expect("read"),
            "ssh-ed25519 AAAA person\n"
        );
        assert_eq!(std::fs::metadata(&key).expect("stat").nlink(), 2);

        // An existing file keeps its mode exactly, set-id and sticky bits included.
        std::fs::remove_file(root.join("a.txt")).expect("unlink");
        for mode in [0o600, 0o755, 0o640] {
            std::fs::write(root.join("a.txt"), "x\n").expect("write");
            std::fs::set_permissions(root.join("a.txt"), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
            let outcome = apply_in(root, &job("@@ -1 +1 @@\n-x\n+y\n"));
            assert!(matches!(outcome, Outcome::Patched { .. }), "{outcome:?}");
            let meta = std::fs::metadata(root.join("a.txt")).expect("stat");
            assert_eq!(meta.permissions().mode() & 0o7777, mode);
        }
    }

    /// A laptop with a bound folder `proj` and `~/Downloads` holding `inbox/`, a read-only
    /// project `ro/` and a writable project `rw/` with a blocked `rw/secret/`.
    struct Companion {
        _dir: tempfile::TempDir,
        grants: Grants,
        proj: PathBuf,
        downloads: PathBuf,
    }

    fn companion() -> Companion {
        use agentworks_contract::executor::FolderAccess;
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().canonicalize().expect("canonical").join("home");
        let proj = home.join("proj");
        let downloads = home.join("Downloads");
        for (path, content) in [
            ("proj/a.txt", "a\n"),
            ("Downloads/inbox/notes.txt", "notes\n"),
            ("Downloads/ro/spec.txt", "spec\n"),
            ("Downloads/rw/x.txt", "x\n"),
            ("Downloads/rw/secret/key.txt", "key\n"),
        ] {
            let path = home.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, content).expect("write");
        }
        let dirs = crate::config::Dirs {
            config: home.join(".config/agentworks"),
            state: home.join(".local/state/agentworks"),
            home: home.clone(),
        };
        let args = crate::grants::GrantArgs {
            folders: vec![downloads.join("ro")],
            write_folders: vec![proj.clone(), downloads.join("rw")],
            block: vec![downloads.join("rw/secret")],
            read_only: Vec::new(),
            downloads: vec![proj.clone(), downloads.join("ro"), downloads.join("rw")],
        };
        let grants = Grants::validate(&args, &dirs).expect("valid grants");
        for (alias, access) in [
            ("proj", FolderAccess::ReadWrite),
            ("ro", FolderAccess::ReadOnly),
            ("rw", FolderAccess::ReadWrite),
        ] {
            assert_eq!(grants.folder(alias).expect(alias).access, access);
        }
        Companion {
            _dir: dir,
            grants,
            proj,
            downloads,
        }
    }

    impl Companion {
        fn job(&self, bound: &str, filepath: &Path, diff: &str) -> PatchJob {
            let folder = self.grants.folder(bound).expect("folder");
            PatchJob::new(
                &self.grants,
                folder,
                filepath.to_string_lossy().into_owned(),
                diff.to_owned(),
            )
        }

        fn read(&self, path: &Path) -> String {
            std::fs::read_to_string(path).expect("read")
        }
    }

    #[test]
    fn the_downloads_guard_keeps_its_blocks_and_nested_read_only_projects() {
        let c = companion();
        let guard = c.grants.downloads_guard().expect("downloads is shared");
        assert_eq!(guard.blocked_paths, ["rw/secret"]);
        assert_eq!(guard.read_only_paths, ["ro"]);
        let mut without = c.grants.clone();
        without.downloads = None;
        assert!(without.downloads_guard().is_none());
    }

    #[test]
    fn absolute_downloads_paths_are_patched_in_downloads_under_its_guard() {
        let c = companion();
        let notes = c.downloads.join("inbox/notes.txt");
        let n = notes.display();
        // Absolute headers, or relative ones read inside filepath's folder.
        for diff in [
            format!("--- {n}\n+++ {n}\n@@ -1 +1 @@\n-notes\n+NOTES\n"),
            "--- a/inbox/notes.txt\n+++ b/inbox/notes.txt\n@@ -1 +1 @@\n-NOTES\n+Notes\n".into(),
            "@@ -1 +1 @@\n-Notes\n+notes!\n".into(),
        ] {
            let outcome = apply_in(&c.proj, &c.job("proj", &notes, &diff));
            assert_eq!(patched_paths(&outcome), [n.to_string()]);
        }
        assert_eq!(c.read(&notes), "notes!\n");
        // A new file in Downloads.
        let new = c.downloads.join("inbox/new.txt");
        let diff = format!(
            "--- /dev/null\n+++ {}\n@@ -0,0 +1 @@\n+new\n",
            new.display()
        );
        let outcome = apply_in(&c.proj, &c.job("proj", &new, &diff));
        assert!(matches!(outcome, Outcome::Patched { .. }), "{outcome:?}");
        assert_eq!(c.read(&new), "new\n");

        // A read-only project nested in Downloads stays read-only, a blocked path blocked.
        for (path, from, want) in [
            ("ro/spec.txt", "spec", "read_only"),
            ("rw/secret/key.txt", "key", "blocked"),
        ] {
            let file = c.downloads.join(path);
            let diff = format!("@@ -1 +1 @@\n-{from}\n+changed\n");
            let outcome = apply_in(&c.proj, &c.job("proj", &file, &diff));
            assert_eq!(refusal(&outcome).0, want, "{path}");
            assert_eq!(c.read(&file), format!("{from}\n"));
        }
        // A writable project nested in Downloads, named by its absolute path from its own
        // binding, is patched in that folder (its own guard), not in Downloads.
        let x = c.downloads.join("rw/x.txt");
        let outcome = apply_in(
            &c.downloads.join("rw"),
            &c.job("rw", &x, "@@ -1 +1 @@\n-x\n+X\n"),
        );
        assert_eq!(patched_paths(&outcome), ["x.txt"]);
    }

    #[test]
    fn a_patch_never_spans_two_folders_nor_leaves_them() {
        let c = companion();
        let notes = c.downloads.join("inbox/notes.txt");
        let a = c.proj.join("a.txt");
        // Relative headers are read in filepath's folder, so the bound folder's file is named
        // by its absolute path here.
        let in_proj = format!("--- {0}\n+++ {0}\n@@ -1 +1 @@\n-a\n+A\n", a.display());
        let in_downloads = format!(
            "--- {0}\n+++ {0}\n@@ -1 +1 @@\n-notes\n+NOTES\n",
            notes.display()
        );
        let both = format!("{in_proj}{in_downloads}");
        for filepath in [Path::new("a.txt"), a.as_path(), notes.as_path()] {
            let outcome = apply_in(&c.proj, &c.job("proj", filepath, &both));
            let (code, message) = refusal(&outcome);
            assert_eq!(code, "patch_rejected", "{filepath:?}: {message}");
            assert!(message.contains("one folder only"), "{message}");
        }
        assert_eq!(c.read(&a), "a\n");
        assert_eq!(c.read(&notes), "notes\n");

        // An absolute path anywhere else, as filepath or in a header.
        let elsewhere = c.grants.home.join("elsewhere.txt");
        std::fs::write(&elsewhere, "e\n").expect("write");
        let e = elsewhere.display();
        let diff = format!("--- {e}\n+++ {e}\n@@ -1 +1 @@\n-e\n+E\n");
        for filepath in [elsewhere.as_path(), Path::new("a.txt")] {
            let outcome = apply_in(&c.proj, &c.job("proj", filepath, &diff));
            assert_eq!(refusal(&outcome).0, "outside_folder", "{filepath:?}");
        }
        let escape = format!("{}/../elsewhere.txt", c.downloads.display());
        let outcome = apply_in(
            &c.proj,
            &c.job("proj", Path::new(&escape), "@@ -1 +1 @@\n-e\n+E\n"),
        );
        assert_eq!(refusal(&outcome).0, "invalid_path");
        assert_eq!(c.read(&elsewhere), "e\n");

        // Without --downloads an absolute Downloads path is just outside.
        let mut job = c.job("proj", &notes, &in_downloads);
        job.downloads = None;
        assert_eq!(refusal(&apply_in(&c.proj, &job)).0, "outside_folder");
        assert_eq!(c.read(&notes), "notes\n");
    }

    /// The refusal text the executor sends starts with these, as it did when they were
    /// formatted by hand (a rustix errno reads as the io::Error it becomes).
    #[test]
    fn write_errors_read_as_the_executor_reports_them() {
        let path = RelPath::parse("docs/a.txt").expect("path");
        let errno = rustix::io::Errno::NOSPC;
        assert_eq!(
            WriteError::write(&path, errno).to_string(),
            format!("cannot write docs/a.txt: {errno}")
        );
        assert_eq!(
            WriteError::TempFile {
                path: path.clone(),
                source: errno.into(),
            }
            .to_string(),
            format!("cannot create a temp file beside docs/a.txt: {errno}")
        );
        assert_eq!(
            WriteError::Replaced { path }.to_string(),
            "docs/a.txt was replaced or linked elsewhere after it was validated; nothing was \
             written to it"
        );
    }
}
