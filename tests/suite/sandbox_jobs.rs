//! Job control inside the sandbox (issue 42, item 6): background jobs, `wait` and its exit
//! status, `kill` of a job, a pipeline with a background stage and `make -j4`, run by the real
//! launcher twice, as root (the root launcher, with its PID namespace) through the shell runner
//! and as an unprivileged user straight through `agentworks __sandbox-exec`.
//!
//! The bug: the launcher blocks SIGCHLD and the stop signals for its `sigwait`, and the shell
//! inherited that mask across fork and exec (std has kept the parent's mask in a child since Rust
//! 1.66). dash waits for a job in `sigsuspend` with the mask it started with, so with SIGCHLD
//! blocked it never woke: `(exit 3) & wait $!` hung until the command's timeout, whose SIGTERM
//! made the launcher answer 143; and a job could not be stopped with SIGTERM.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agentworks_laptop::shell::{self, ShellRequest};
use agentworks_sandbox::{self as sandbox, SandboxPolicy};
use tokio_util::sync::CancellationToken;

use super::harness::{ensure_user, users_lock};

/// The bound on each command: a pattern that hangs (the bug) fails the test at this bound.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The patterns, each with what it must print (as `sh -c` prints it outside the sandbox).
const PATTERNS: &[(&str, &str)] = &[
    // The command starts with no signal blocked, as it would outside. `exec` keeps the shell's
    // mask for grep (in the root launcher's PID namespace the shell is pid 1, so /proc/$$ would
    // name another process).
    (
        "exec grep '^SigBlk:' /proc/self/status",
        "SigBlk:\t0000000000000000\n",
    ),
    // `&` then `wait $pid` gives the job's own exit status.
    ("(exit 3) & p=$!; wait $p; echo $?", "3\n"),
    // `wait` for every job, in a nested shell (it hung until the timeout).
    ("sh -c 'sleep 0.1 & wait'; echo done", "done\n"),
    // A job ended by SIGTERM is reported as 128+15 (dash says "Terminated" on stderr).
    (
        "exec 2>/dev/null; sleep 30 & p=$!; kill $p; wait $p; echo $?",
        "143\n",
    ),
    // A pipeline running as a background job, then its status.
    (
        "printf 'b\\na\\n' | sort > sorted & p=$!; wait $p; echo $?; cat sorted",
        "0\na\nb\n",
    ),
    // A pipeline whose reader leaves first: the writer dies of SIGPIPE, quietly.
    ("yes | head -n 2; echo $?", "y\ny\n0\n"),
];

/// A Makefile with four independent targets, each a shell recipe with a background job.
const MAKEFILE: &str = "all: a b c d\n\
a b c d:\n\
\t@(sleep 0.1; echo $@ > $@.part) & wait; mv $@.part $@.out\n";

/// A writable project and a scratch dir in a temp dir others may enter (for the unprivileged
/// run), with the Makefile in the project.
struct Folder {
    _dir: tempfile::TempDir,
    project: PathBuf,
    scratch: PathBuf,
}

impl Folder {
    fn new() -> Folder {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let project = root.join("project");
        let scratch = root.join("scratch");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(project.join("Makefile"), MAKEFILE).unwrap();
        Folder {
            _dir: dir,
            project,
            scratch,
        }
    }

    fn policy(&self) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![],
            read_write: vec![self.project.clone()],
            read_only: vec![],
            blocked: vec![],
            read_only_within: vec![],
            denied: vec![],
            read_only_if_present: vec![],
            scratch: self.scratch.clone(),
            cwd: self.project.clone(),
            limits: Default::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    /// Gives the whole temp dir to `uid:gid`.
    fn chown(&self, uid: u32, gid: u32) {
        let root = self.project.parent().unwrap();
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(root)
            .status()
            .unwrap();
        assert!(status.success());
        std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
}

/// `command` through the shell runner, as root: exit code, stdout, stderr.
async fn as_root(folder: &Folder, command: &str) -> Printed {
    let request = ShellRequest {
        command: command.to_owned(),
        timeout: Some(TIMEOUT),
        policy: folder.policy(),
        env_extra: vec![],
    };
    let out = shell::run(
        Path::new(env!("CARGO_BIN_EXE_agentworks")),
        request,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    if out.timed_out {
        return (
            None,
            out.stdout,
            format!("timed out after {TIMEOUT:?}; {}", out.stderr),
        );
    }
    (out.exit_code, out.stdout, out.stderr)
}

/// `command` through `agentworks __sandbox-exec` as `uid:gid` (no capability, so no PID
/// namespace): exit code, stdout, stderr. `timeout` bounds it: its SIGTERM makes the launcher
/// end every process of the command, so the output pipes close.
fn as_user(folder: &Folder, uid: u32, gid: u32, command: &str) -> Printed {
    let policy = serde_json::to_string(&folder.policy()).unwrap();
    let out = Command::new("timeout")
        .arg(TIMEOUT.as_secs().to_string())
        .arg(env!("CARGO_BIN_EXE_agentworks"))
        .args([sandbox::SUBCOMMAND, &policy, "--", "/bin/sh", "-c", command])
        .current_dir(&folder.project)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TMPDIR", &folder.scratch)
        .stdin(Stdio::null())
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    if out.status.code() == Some(124) {
        return (None, String::new(), format!("timed out after {TIMEOUT:?}"));
    }
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What one run printed: exit code, stdout, stderr.
type Printed = (Option<i32>, String, String);

/// The patterns (and `make -j4`) that did not exit 0 printing what they print outside, with what
/// they did print; all of them are run before the test fails.
fn mismatches(mut run: impl FnMut(&str) -> Printed) -> Vec<String> {
    let make = ("make -s -j4 && cat a.out b.out c.out d.out", "a\nb\nc\nd\n");
    PATTERNS
        .iter()
        .chain([&make])
        .filter_map(|(command, expected)| {
            let printed = run(command);
            let wanted = (Some(0), (*expected).to_owned(), String::new());
            (printed != wanted).then(|| format!("`{command}`: {printed:?}, not {wanted:?}"))
        })
        .collect()
}

/// The control: every pattern prints what the test expects with no sandbox at all.
#[test]
fn the_patterns_print_this_outside_the_sandbox() {
    let folder = Folder::new();
    let wrong = mismatches(|command| {
        let out = Command::new("/bin/sh")
            .args(["-c", command])
            .current_dir(&folder.project)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    });
    assert!(
        wrong.is_empty(),
        "outside the sandbox:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn background_jobs_wait_and_kill_as_outside_under_the_root_launcher() {
    let folder = Folder::new();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let wrong = mismatches(|command| rt.block_on(as_root(&folder, command)));
    assert!(wrong.is_empty(), "as root:\n{}", wrong.join("\n"));
}

#[test]
fn background_jobs_wait_and_kill_as_outside_for_an_unprivileged_person() {
    let (uid, gid) = {
        let _lock = users_lock();
        ensure_user("awtest-jobs", &[])
    };
    let folder = Folder::new();
    folder.chown(uid, gid);
    let wrong = mismatches(|command| as_user(&folder, uid, gid, command));
    assert!(
        wrong.is_empty(),
        "as an unprivileged user:\n{}",
        wrong.join("\n")
    );
}
