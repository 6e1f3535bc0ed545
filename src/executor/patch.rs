//! Patches on the laptop: `diff_patch_workspace_file` applied inside a write folder, under the
//! same Landlock sandbox as commands.
//!
//! Owns: the hidden `agentworks __apply-patch <folder>` mode ([`apply_main`]) and the
//! executor-side [`run`] that launches it as
//! `agentworks __sandbox-exec <policy> -- agentworks __apply-patch <folder>` with the job
//! (diff + the folder's guard) on stdin and the [`Outcome`] as JSON on stdout.
//!
//! Why a re-exec and not a forked child: the sandbox module's ruleset building is private to
//! its launcher, and a fork of the multi-threaded tokio executor could only safely exec anyway;
//! the launcher already forks, confines and reaps, so the applier is just another program it
//! runs. The executable itself is granted read/execute in the policy (it may live outside the
//! system paths, e.g. in a build tree).
//!
//! The applier splits the diff into files ([`crate::patch::split_files`]), and validates EVERY
//! file before changing any: the path is a [`RelPath`] inside the folder, passes the folder's
//! guard (not blocked, not read-only, not `workflow.json`/`product.json`), is opened with
//! `openat2` beneath the folder (no symlink anywhere, no escape), is a regular UTF-8 file (or is
//! missing, for a `/dev/null` creation), and its hunks match strictly. Only then does it write
//! each file (temp file, fsync, rename, fsync of the folder). Renames and deletions are refused.
//!
//! Must never: change a file when any file of the diff fails validation; follow a symlink;
//! write outside the folder.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::gateway::protocol::{Outcome, PatchedFile};
use crate::guard::{Guard, RelPath};
use crate::workspace::confine::{self, ConfineError};
use crate::workspace::revision::Revision;

use super::sandbox::{REFUSAL_PREFIX, SUBCOMMAND as SANDBOX_SUBCOMMAND, SandboxPolicy};

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
    pub guard: Guard,
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

struct Planned {
    path: RelPath,
    content: String,
    mode: u32,
    existed: bool,
}

fn write_in_place(dir: &std::os::fd::OwnedFd, name: &str, planned: &Planned) -> Result<(), String> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot write {}: {e}", planned.path))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(planned.content.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", planned.path))
}

/// Map a diff path to a folder-relative path (`folder/` prefixes of absolute paths removed).
fn relative(folder: &Path, raw: &str) -> Result<RelPath, Outcome> {
    let stripped = Path::new(raw)
        .strip_prefix(folder)
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let raw = stripped.as_deref().unwrap_or(raw);
    RelPath::parse(raw).map_err(|e| refused("invalid_path", e.to_string()))
}

/// Validate every file, then apply every file. The process is expected to be sandboxed already.
pub fn apply_in(folder: &Path, job: &PatchJob) -> Outcome {
    match validate(folder, job) {
        Ok((root, plan)) => write_all(&root, plan),
        Err(outcome) => outcome,
    }
}

fn validate(
    folder: &Path,
    job: &PatchJob,
) -> Result<(std::os::fd::OwnedFd, Vec<Planned>), Outcome> {
    let guard = job
        .guard
        .resolve()
        .map_err(|e| refused("invalid_guard", e.to_string()))?;
    let root = rustix::fs::open(
        folder,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| refused("folder_unavailable", format!("cannot open the folder: {e}")))?;
    let parts =
        crate::patch::split_files(&job.diff).map_err(|e| refused("invalid_diff", e.to_string()))?;
    let mut plan: Vec<Planned> = Vec::new();
    for part in parts {
        let (old, new) = match (&part.old_path, &part.new_path) {
            (None, None) => (Some(job.filepath.clone()), Some(job.filepath.clone())),
            other => (other.0.clone(), other.1.clone()),
        };
        let Some(new) = new else {
            return Err(refused(
                "unsupported",
                "deleting files by patch is not supported; use a command",
            ));
        };
        let path = relative(folder, &new)?;
        if let Some(old) = &old
            && relative(folder, old)? != path
        {
            return Err(refused(
                "unsupported",
                format!("renaming {old} to {new} by patch is not supported; use a command"),
            ));
        }
        if plan.iter().any(|p| p.path == path) {
            return Err(refused(
                "invalid_diff",
                format!("{path} appears twice in the diff"),
            ));
        }
        guard
            .check_write(&path)
            .map_err(|e| refused(e.reason(), e.to_string()))?;
        let (base, mode) = match confine::open_parent(root.as_fd(), &path, false) {
            Ok((dir, name)) => match confine::open_file(dir.as_fd(), name, &path) {
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
                    (Some(text), stat.st_mode & 0o7777)
                }
                Ok(None) => (None, 0o666),
                Err(e) => return Err(confine_refusal(e)),
            },
            // A new file may create its missing parent folders.
            Err(ConfineError::NotFound { .. }) if old.is_none() => (None, 0o666),
            Err(e) => return Err(confine_refusal(e)),
        };
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
        let content = crate::patch::apply_strict(&base, &part.text)
            .map_err(|e| refused("patch_mismatch", format!("{path}: {e}")))?;
        plan.push(Planned {
            path,
            content,
            mode,
            existed: old.is_some(),
        });
    }
    Ok((root, plan))
}

fn write_one(root: &std::os::fd::OwnedFd, planned: &Planned) -> Result<(), String> {
    let (dir, name) =
        confine::open_parent(root.as_fd(), &planned.path, true).map_err(|e| e.to_string())?;
    let tmp = format!(
        ".agentworks-patch-{}",
        hex::encode(rand::random::<[u8; 8]>())
    );
    let fd = rustix::fs::openat(
        &dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(planned.mode),
    );
    let fd = match fd {
        Ok(fd) => fd,
        // The sandbox grants a folder that lies on the path to a --block/--read-only exclusion
        // only its existing entries, so no temp file can be made there: an existing file is
        // then rewritten in place (validated already; not atomic against a crash).
        Err(rustix::io::Errno::ACCESS) if planned.existed => {
            return write_in_place(&dir, name, planned);
        }
        Err(e) => {
            return Err(format!(
                "cannot create a temp file beside {}: {e}",
                planned.path
            ));
        }
    };
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(planned.content.as_bytes())
        .and_then(|()| {
            rustix::fs::fchmod(&file, Mode::from_raw_mode(planned.mode)).map_err(Into::into)
        })
        .and_then(|()| file.sync_all())
        .and_then(|()| rustix::fs::renameat(&dir, tmp.as_str(), &dir, name).map_err(Into::into))
        .and_then(|()| rustix::fs::fsync(&dir).map_err(Into::into));
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), rustix::fs::AtFlags::empty());
        return Err(format!("cannot write {}: {e}", planned.path));
    }
    Ok(())
}

fn write_all(root: &std::os::fd::OwnedFd, plan: Vec<Planned>) -> Outcome {
    let mut files = Vec::new();
    for planned in &plan {
        if let Err(message) = write_one(root, planned) {
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
                format!("{message}; files already changed: [{}]", changed.join(", ")),
            );
        }
        files.push(PatchedFile {
            path: planned.path.to_string(),
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
    let mut policy = policy.clone();
    policy.read_only.push(launcher.to_owned());
    let policy_json = match serde_json::to_string(&policy) {
        Ok(json) => json,
        Err(e) => return refused("internal", e.to_string()),
    };
    let job_json = match serde_json::to_vec(job) {
        Ok(json) => json,
        Err(e) => return refused("internal", e.to_string()),
    };
    let mut command = tokio::process::Command::new(launcher);
    command
        .arg(SANDBOX_SUBCOMMAND)
        .arg(&policy_json)
        .arg("--")
        .arg(launcher)
        .arg(SUBCOMMAND)
        .arg(folder)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir(folder)
        .kill_on_drop(true)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    super::sandbox::new_session(&mut command);
    super::sandbox::die_with_parent(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return refused(
                "sandbox_unavailable",
                format!("cannot start the launcher: {e}"),
            );
        }
    };
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let io = async {
        if let Some(mut pipe) = stdin.take() {
            let _ = pipe.write_all(&job_json).await;
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
    };
    let Ok((status, out, err)) = tokio::time::timeout(PATCH_TIMEOUT, io).await else {
        return refused(
            "timeout",
            "the patch did not finish in time; inspect the files before retrying",
        );
    };
    let err = String::from_utf8_lossy(&err);
    if let Some(reason) = err.strip_prefix(REFUSAL_PREFIX) {
        return refused(
            "sandbox_unavailable",
            format!("the patch was not applied: {}", reason.trim_end()),
        );
    }
    match serde_json::from_slice::<Outcome>(&out) {
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
}
