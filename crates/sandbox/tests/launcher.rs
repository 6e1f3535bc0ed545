//! The sandbox crate driven as a program other than the laptop CLI drives it (the server's
//! coding-CLI runner): this test binary is its own launcher — its `main` calls
//! `main_if_launcher` first, and `Launcher::current_exe()` names it — and every test starts a
//! real command through that launcher, under a real Landlock ruleset, and reads and writes its
//! pipes while it runs, signals it, ends its tree or drops it.
//!
//! Linux: the checks that processes are gone read `/proc`.
//!
//! `harness = false` (Cargo.toml): libtest's `main` is not ours, so a libtest binary could not
//! be a launcher. The lines at the end run the tests instead; names given on the command line
//! select the tests whose names contain them.

// Not compiled as `cfg(test)` (no harness), so the workspace's unwrap lints would apply: in a
// test, a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use agentworks_sandbox::SandboxPolicy;
use agentworks_sandbox::process::{Launcher, SandboxCommand, SandboxedChild, Stream, refusal};
use agentworks_sandbox::shell::{self, ShellCommand};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::ChildStdout;
use tokio_util::sync::CancellationToken;

const SECRET: &str = "OUTSIDE-SECRET-FIXTURE-3b9e";
const PATH: &str = "/usr/bin:/bin";

/// A writable project with a README, a private scratch dir, and a secret outside both.
struct Fixture {
    _dir: tempfile::TempDir,
    project: PathBuf,
    scratch: PathBuf,
    outside: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let project = root.join("project");
        let scratch = root.join("scratch");
        let outside = root.join("outside");
        for folder in [&project, &scratch, &outside] {
            std::fs::create_dir(folder).unwrap();
        }
        std::fs::write(project.join("README"), "hello\n").unwrap();
        std::fs::write(outside.join("secret"), SECRET).unwrap();
        Fixture {
            _dir: dir,
            project,
            scratch,
            outside,
        }
    }

    fn policy(&self) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![],
            read_write: vec![self.project.clone()],
            read_only: vec![],
            read_only_if_present: vec![],
            blocked: vec![],
            read_only_within: vec![],
            denied: vec![],
            scratch: self.scratch.clone(),
            cwd: self.project.clone(),
            limits: Default::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    /// `/bin/sh -c <script>` with PATH, TMPDIR (the scratch dir) and OUTSIDE set, stdout piped.
    fn shell(&self, script: &str) -> SandboxCommand {
        let mut command = SandboxCommand::new("/bin/sh", self.policy());
        command
            .args(["-c", script])
            .env("PATH", PATH)
            .env("TMPDIR", &self.scratch)
            .env("OUTSIDE", &self.outside)
            .stdout(Stream::Piped);
        command
    }
}

fn launcher() -> Launcher {
    Launcher::current_exe().unwrap()
}

fn lines(child: &mut SandboxedChild) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().unwrap()).lines()
}

/// The command's next line; a command that prints nothing for a minute fails the test rather
/// than hang it.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("no line from the command within a minute")
        .unwrap()
        .expect("stdout ended")
}

/// Everything a piped stream gives until it ends, as text.
async fn read_to_end(pipe: Option<impl AsyncRead + Unpin>) -> String {
    let mut text = String::new();
    pipe.expect("the stream is piped")
        .read_to_string(&mut text)
        .await
        .unwrap();
    text
}

/// A script that starts two sleepers whose command line holds `marker` (a link to `sleep` in
/// the scratch dir), one in a session of its own, and says `started`.
fn sleepers(marker: &str) -> String {
    format!(
        "ln -s \"$(command -v sleep)\" \"$TMPDIR/{marker}\" && \
         ( setsid \"$TMPDIR/{marker}\" 300 & ) ; \"$TMPDIR/{marker}\" 300 & echo started; wait"
    )
}

/// Every live process whose command line contains `marker` (the sleepers, and the shell and
/// launcher whose arguments name them), as `"<pid>: <command line>"`.
fn processes_with(marker: &str) -> Vec<String> {
    command_lines()
        .into_iter()
        .filter(|(_, args)| args.iter().any(|a| a.contains(marker)))
        .map(|(pid, args)| format!("{pid}: {}", args.join(" ")))
        .collect()
}

/// How many live processes run as the sleeper `marker` (their `argv[0]` is its link).
fn sleepers_running(marker: &str) -> usize {
    command_lines()
        .iter()
        .filter(|(_, args)| {
            args.first()
                .is_some_and(|a| a.ends_with(&format!("/{marker}")))
        })
        .count()
}

/// Each process's pid and arguments, from `/proc/<pid>/cmdline` (empty for a zombie).
fn command_lines() -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let args = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            found.push((pid, args));
        }
    }
    found
}

/// Polls until `cond` holds; fails with `what` if it has not after 30 s (a bound on whether it
/// happens at all, not on how fast).
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn marker(test: &str) -> String {
    format!("aw-sandbox-{test}-{}", std::process::id())
}

/// A long-running command answers line by line on its pipes: each answer is read before the
/// next line is written, which a run-to-completion API could not do.
async fn pipes_are_read_and_written_while_the_command_runs() {
    let f = Fixture::new();
    let mut command = f.shell("while read -r line; do echo \"got $line\"; done; echo bye");
    command.stdin(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = lines(&mut child);
    for word in ["one", "two", "three"] {
        stdin
            .write_all(format!("{word}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
        assert_eq!(next_line(&mut lines).await, format!("got {word}"));
    }
    drop(stdin);
    assert_eq!(next_line(&mut lines).await, "bye");
    assert_eq!(lines.next_line().await.unwrap(), None);
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
}

/// The command's environment is exactly what the caller set: nothing of this process's (which
/// has PATH, HOME and cargo's variables) comes through.
async fn the_environment_is_only_what_the_caller_set() {
    assert!(std::env::var_os("PATH").is_some(), "the test needs a PATH");
    let f = Fixture::new();
    let mut command = SandboxCommand::new("/usr/bin/env", f.policy());
    command
        .env("ONE", "1")
        .env("TWO", "2")
        .env("ONE", "one")
        .stdout(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0), "{out}");
    let mut vars: Vec<&str> = out.lines().collect();
    vars.sort_unstable();
    assert_eq!(vars, ["ONE=one", "TWO=2"]);
}

/// The program runs under the policy: the project is readable and writable, a file outside it
/// is neither.
async fn the_command_runs_under_the_policy() {
    let f = Fixture::new();
    let mut child = f
        .shell(
            "cat README; cat \"$OUTSIDE/secret\"; echo \"read outside: $?\"; \
             echo a > new.txt; echo b > \"$OUTSIDE/new.txt\"; echo \"wrote outside: $?\"",
        )
        .spawn(&launcher())
        .unwrap();
    let out = read_to_end(child.stdout.take()).await;
    child.wait().await.unwrap();
    assert!(out.starts_with("hello\n"), "{out}");
    assert!(!out.contains(SECRET), "{out}");
    assert!(!out.contains("read outside: 0"), "{out}");
    assert!(!out.contains("wrote outside: 0"), "{out}");
    assert!(f.project.join("new.txt").exists());
    assert!(!f.outside.join("new.txt").exists());
}

/// `signal` reaches the command, which traps it and exits as it chooses; the launcher, which
/// would take SIGINT as a request to end the tree (128+2), is not signalled.
async fn a_signal_reaches_the_command_and_not_the_launcher() {
    let f = Fixture::new();
    let mut child = f
        .shell("trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 1; done")
        .spawn(&launcher())
        .unwrap();
    let mut lines = lines(&mut child);
    assert_eq!(next_line(&mut lines).await, "ready");
    let signalled = child.signal(Signal::SIGINT);
    assert!(signalled >= 1, "signalled {signalled}");
    assert_eq!(next_line(&mut lines).await, "got-int");
    assert_eq!(child.wait().await.unwrap().code(), Some(3));
    assert_eq!(child.signal(Signal::SIGINT), 0, "nothing left to signal");
}

/// What the caller ignored is not the command's: started from a process that ignores SIGINT,
/// SIGQUIT and SIGHUP (as a script's `cmd &` and `nohup` start one), the command can still
/// trap them, so `signal` reaches it. A non-interactive shell cannot trap a signal ignored on
/// entry, so without the launcher's reset this command never prints got-int.
async fn signals_the_caller_ignored_are_the_commands_to_trap() {
    use nix::sys::signal::{SigHandler, signal};
    let f = Fixture::new();
    let ignored = [Signal::SIGINT, Signal::SIGQUIT, Signal::SIGHUP];
    let before: Vec<SigHandler> = ignored
        .iter()
        // SAFETY: SIG_IGN installs no handler; this harness runs one test at a time.
        .map(|&s| unsafe { signal(s, SigHandler::SigIgn) }.unwrap())
        .collect();
    let spawned = f
        .shell("trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 1; done")
        .spawn(&launcher());
    for (&s, &handler) in ignored.iter().zip(&before) {
        // SAFETY: puts back what this process had.
        unsafe { signal(s, handler) }.unwrap();
    }
    let mut child = spawned.unwrap();
    let mut lines = lines(&mut child);
    assert_eq!(next_line(&mut lines).await, "ready");
    assert!(child.signal(Signal::SIGINT) >= 1);
    assert_eq!(next_line(&mut lines).await, "got-int");
    assert_eq!(child.wait().await.unwrap().code(), Some(3));
}

/// `kill_tree` ends every process of the command, one in a session of its own included, before
/// it returns.
async fn kill_tree_ends_every_process_of_the_command() {
    let f = Fixture::new();
    let marker = marker("kill-tree");
    let mut child = f.shell(&sleepers(&marker)).spawn(&launcher()).unwrap();
    let mut lines = lines(&mut child);
    assert_eq!(next_line(&mut lines).await, "started");
    wait_until("both sleepers run", || sleepers_running(&marker) == 2);
    let status = child.kill_tree().await.unwrap();
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    assert_eq!(
        status.code(),
        Some(128 + Signal::SIGTERM as i32),
        "{status}"
    );
}

/// A handle dropped while its command runs ends the command's tree.
async fn a_dropped_handle_ends_the_tree() {
    let f = Fixture::new();
    let marker = marker("dropped");
    let mut child = f.shell(&sleepers(&marker)).spawn(&launcher()).unwrap();
    let mut lines = lines(&mut child);
    assert_eq!(next_line(&mut lines).await, "started");
    wait_until("both sleepers run", || sleepers_running(&marker) == 2);
    drop(child);
    wait_until("the dropped command's processes are gone", || {
        processes_with(&marker).is_empty()
    });
}

/// A launcher that cannot build the sandbox (here: the scratch dir is missing) refuses before
/// anything runs, and says why on stderr.
async fn a_refusal_says_why_and_nothing_runs() {
    let f = Fixture::new();
    let mut policy = f.policy();
    policy.scratch = f.scratch.join("missing");
    let mut command = SandboxCommand::new("/bin/sh", policy);
    command
        .args(["-c", "touch ran"])
        .env("PATH", PATH)
        .stderr(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let err = read_to_end(child.stderr.take()).await;
    let status = child.wait().await.unwrap();
    let reason = refusal(&status, &err).unwrap_or_else(|| panic!("not a refusal: {status} {err}"));
    assert!(reason.contains("scratch dir"), "{reason}");
    assert!(!f.project.join("ran").exists());
}

/// The run-to-completion helper through this launcher: output captured, and a command that
/// outlives its timeout is ended with every process it started.
async fn a_shell_command_runs_to_completion_and_its_timeout_ends_the_tree() {
    let f = Fixture::new();
    let marker = marker("shell-timeout");
    let command = |script: String, timeout: u64| ShellCommand {
        command: script,
        timeout: Some(Duration::from_secs(timeout)),
        policy: f.policy(),
        env: vec![("PATH".into(), PATH.into())],
    };
    let done = shell::run(
        &launcher(),
        command("cat README; echo oops >&2; exit 4".to_owned(), 60),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (done.exit_code, done.stdout.as_str(), done.stderr.as_str()),
        (Some(4), "hello\n", "oops\n")
    );
    assert!(!done.timed_out);
    let out = shell::run(
        &launcher(),
        command(sleepers(&marker), 1),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout, "started\n");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
}

/// A PTY of this (unsandboxed) process on the machine's devpts, as another chat's or the
/// person's terminal would be: its master, its slave and the slave's path.
#[cfg(target_os = "linux")]
fn outside_pty() -> (std::fs::File, std::fs::File, String) {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt returns a new descriptor (or -1) and touches no memory of ours.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `master` is a descriptor we just opened and own alone.
    let master_file = unsafe { std::fs::File::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 64];
    // SAFETY: grantpt and unlockpt take the descriptor only; ptsname_r writes at most
    // `name.len()` bytes, NUL included, into the live buffer it is given.
    unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
    }
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    use std::os::unix::fs::OpenOptionsExt;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap();
    (master_file, slave, path)
}

/// Tries to open a terminal by path; says `opened <path>` (and writes into it) or
/// `refused <path> <errno>`.
#[cfg(target_os = "linux")]
const TRY_OPEN: &str = r#"
import os, sys
def try_open(path):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        print("refused", path, e.errno, flush=True)
        return
    try:
        os.write(fd, b"typed-from-the-sandbox\n")
    except OSError:
        pass
    print("opened", path, flush=True)
"#;

/// With private terminals a command makes PTYs (`openpty`, `script`, `/dev/tty` on its own),
/// sees none of the machine's in `/dev/pts`, and cannot open one, neither by its path nor
/// through `/proc/<pid>/fd` of the process that holds it; nothing reaches that terminal.
#[cfg(target_os = "linux")]
async fn private_terminals_give_a_pty_and_none_of_the_machines() {
    let f = Fixture::new();
    let (mut master, slave, outside) = outside_pty();
    let me = std::process::id();
    let slave_fd = std::os::fd::AsRawFd::as_raw_fd(&slave);
    let master_fd = std::os::fd::AsRawFd::as_raw_fd(&master);
    let script = format!(
        "{TRY_OPEN}
print('listed', sorted(os.listdir('/dev/pts')), flush=True)
for path in ['{outside}', '/proc/{me}/fd/{slave_fd}', '/proc/{me}/fd/{master_fd}']:
    try_open(path)
import pty
m, s = pty.openpty()
print('made', os.ttyname(s), flush=True)
os.write(m, b'through-the-pty\\n')
print('read', os.read(s, 100).decode().strip(), flush=True)
print('listed-after', sorted(os.listdir('/dev/pts')), flush=True)
"
    );
    let mut policy = f.policy();
    policy.private_terminals = true;
    let mut command = SandboxCommand::new("/usr/bin/python3", policy.clone());
    command
        .args(["-c", &script])
        .env("PATH", PATH)
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    let err = read_to_end(child.stderr.take()).await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0), "{out}{err}");
    assert!(out.contains("listed ['ptmx']\n"), "{out}");
    for path in [
        outside.clone(),
        format!("/proc/{me}/fd/{slave_fd}"),
        format!("/proc/{me}/fd/{master_fd}"),
    ] {
        assert!(out.contains(&format!("refused {path} ")), "{path}: {out}");
    }
    assert!(!out.contains("opened"), "{out}");
    assert!(out.contains("made /dev/pts/0\n"), "{out}");
    assert!(out.contains("read through-the-pty\n"), "{out}");
    assert!(out.contains("listed-after ['0', 'ptmx']\n"), "{out}");
    // Nothing was typed into the outside terminal: its master has nothing to read.
    assert_eq!(pending(&mut master), "", "the outside terminal got input");

    // `script` makes a PTY and its session's controlling terminal, which `tty` names and
    // `/dev/tty` opens.
    let mut command = SandboxCommand::new("/usr/bin/script", policy);
    command
        .args(["-qec", "tty; echo hi-$((6*7)) > /dev/tty", "/dev/null"])
        .env("PATH", PATH)
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    let err = read_to_end(child.stderr.take()).await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0), "{out}{err}");
    assert!(out.contains("/dev/pts/0"), "{out}{err}");
    assert!(out.contains("hi-42"), "{out}{err}");
    drop(slave);
}

/// What can be read from the master of a PTY right now, without waiting.
#[cfg(target_os = "linux")]
fn pending(master: &mut std::fs::File) -> String {
    use std::io::Read;
    let fd = std::os::fd::AsRawFd::as_raw_fd(master);
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes the number of readable bytes into the valid int it is given.
    assert_eq!(unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) }, 0);
    let mut buf = vec![0u8; usize::try_from(queued).unwrap()];
    master.read_exact(&mut buf).unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

/// Without private terminals (the laptop's rule) no terminal device opens: `openpty` and
/// `script` fail, `/dev/ptmx`, `/dev/pts/*` and `/dev/tty` are refused.
#[cfg(target_os = "linux")]
async fn without_private_terminals_no_terminal_opens() {
    let f = Fixture::new();
    let (_master, _slave, outside) = outside_pty();
    let script = format!(
        "{TRY_OPEN}
for path in ['/dev/ptmx', '/dev/pts/ptmx', '{outside}', '/dev/tty']:
    try_open(path)
import pty
try:
    pty.openpty()
    print('made a pty', flush=True)
except OSError:
    print('openpty failed', flush=True)
"
    );
    let mut command = SandboxCommand::new("/usr/bin/python3", f.policy());
    command
        .args(["-c", &script])
        .env("PATH", PATH)
        .stdout(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0), "{out}");
    for path in ["/dev/ptmx", "/dev/pts/ptmx", &outside] {
        assert!(
            out.contains(&format!("refused {path} {}", libc::EACCES)),
            "{path}: {out}"
        );
    }
    // No controlling terminal (ENXIO) or not granted (EACCES): refused either way.
    assert!(out.contains("refused /dev/tty "), "{out}");
    assert!(!out.contains("opened"), "{out}");
    assert!(out.contains("openpty failed\n"), "{out}");

    let mut command = SandboxCommand::new("/usr/bin/script", f.policy());
    command
        .args(["-qec", "tty", "/dev/null"])
        .env("PATH", PATH)
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    let _ = read_to_end(child.stderr.take()).await;
    assert_ne!(child.wait().await.unwrap().code(), Some(0), "{out}");
    assert!(!out.contains("/dev/pts/"), "{out}");
}

/// Where private terminals cannot be made (here the refusal of user namespaces is simulated)
/// the command gets no terminal at all, and its stderr says why.
#[cfg(target_os = "linux")]
async fn where_private_terminals_cannot_be_made_there_is_no_terminal_and_stderr_says_so() {
    let f = Fixture::new();
    let mut policy = f.policy();
    policy.private_terminals = true;
    let mut command = SandboxCommand::new("/usr/bin/python3", policy);
    command
        .args([
            "-c",
            &format!("{TRY_OPEN}\ntry_open('/dev/ptmx')\nprint(sorted(os.environ))"),
        ])
        .env("PATH", PATH)
        .env(agentworks_sandbox::TEST_NO_USERNS_ENV, "1")
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    let mut child = command.spawn(&launcher()).unwrap();
    let out = read_to_end(child.stdout.take()).await;
    let err = read_to_end(child.stderr.take()).await;
    assert_eq!(child.wait().await.unwrap().code(), Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("refused /dev/ptmx {}", libc::EACCES)),
        "{out}"
    );
    assert!(
        err.starts_with(agentworks_sandbox::NO_TERMINAL_NOTICE),
        "{err}"
    );
    assert!(
        err.contains(agentworks_sandbox::TEST_NO_USERNS_ENV),
        "{err}"
    );
    // The knob is the launcher's, not the command's.
    assert!(
        !out.contains(agentworks_sandbox::TEST_NO_USERNS_ENV),
        "{out}"
    );
}

/// Two commands with private terminals at once, as two chats' (same user): the first holds a
/// PTY open and reads it; the second sees none of it in `/dev/pts`, cannot open it by its path
/// nor through `/proc/<pid>/fd`, and its own `/dev/pts/0` (the same name) is another terminal:
/// what it writes there never reaches the first.
#[cfg(target_os = "linux")]
async fn one_commands_terminal_is_out_of_reach_of_another() {
    let f = Fixture::new();
    let mut policy = f.policy();
    policy.private_terminals = true;
    let holder = r#"
import os, pty, select, sys
m, s = pty.openpty()
print("holding", os.ttyname(s), m, s, flush=True)
got = b""
sys.stdin.readline()
while select.select([m], [], [], 0.5)[0]:
    got += os.read(m, 1000)
print("got", repr(got.decode()), flush=True)
"#;
    let mut first = SandboxCommand::new("/usr/bin/python3", policy.clone());
    first
        .args(["-c", holder])
        .env("PATH", PATH)
        .stdin(Stream::Piped)
        .stdout(Stream::Piped);
    let mut first = first.spawn(&launcher()).unwrap();
    let mut first_in = first.stdin.take().unwrap();
    let mut first_out = lines(&mut first);
    let holding = next_line(&mut first_out).await;
    let fields: Vec<&str> = holding.split_whitespace().collect();
    let ["holding", name, master_fd, slave_fd] = fields[..] else {
        panic!("{holding}");
    };
    assert_eq!(name, "/dev/pts/0", "{holding}");
    // The holder's pid as /proc shows it (its own may be a PID namespace's): the launcher's
    // child.
    let launcher_pid = first.id().unwrap();
    let children =
        std::fs::read_to_string(format!("/proc/{launcher_pid}/task/{launcher_pid}/children"))
            .unwrap();
    let pid = children.split_whitespace().next().expect("the holder runs");

    let attacker = format!(
        "{TRY_OPEN}
print('listed', sorted(os.listdir('/dev/pts')), flush=True)
for path in ['{name}', '/proc/{pid}/fd/{slave_fd}', '/proc/{pid}/fd/{master_fd}']:
    try_open(path)
import pty
m, s = pty.openpty()
print('made', os.ttyname(s), flush=True)
try_open('{name}')
"
    );
    let mut second = SandboxCommand::new("/usr/bin/python3", policy);
    second
        .args(["-c", &attacker])
        .env("PATH", PATH)
        .stdout(Stream::Piped);
    let mut second = second.spawn(&launcher()).unwrap();
    let out = read_to_end(second.stdout.take()).await;
    assert_eq!(second.wait().await.unwrap().code(), Some(0), "{out}");
    assert!(out.contains("listed ['ptmx']\n"), "{out}");
    for path in [
        name.to_owned(),
        format!("/proc/{pid}/fd/{slave_fd}"),
        format!("/proc/{pid}/fd/{master_fd}"),
    ] {
        assert!(out.contains(&format!("refused {path} ")), "{path}: {out}");
    }
    // Its own /dev/pts/0, which it may use.
    assert!(
        out.contains("made /dev/pts/0\nopened /dev/pts/0\n"),
        "{out}"
    );

    first_in.write_all(b"done\n").await.unwrap();
    first_in.flush().await.unwrap();
    assert_eq!(next_line(&mut first_out).await, "got ''");
    assert_eq!(first.wait().await.unwrap().code(), Some(0));
}

type Test = std::pin::Pin<Box<dyn Future<Output = ()>>>;
type TestFn = fn() -> Test;

/// `(name, test)` for each async test function named.
macro_rules! tests {
    ($($test:ident),* $(,)?) => {
        vec![$((stringify!($test), (|| -> Test { Box::pin($test()) }) as TestFn)),*]
    };
}

fn main() -> ExitCode {
    // First, while single-threaded: re-executed as the launcher, this binary becomes it.
    if let Some(code) = agentworks_sandbox::launcher::main_if_launcher() {
        return code;
    }
    if let Err(e) = agentworks_sandbox::check_available() {
        eprintln!("these tests need the sandbox, which this machine refuses: {e}");
        return ExitCode::FAILURE;
    }
    let tests: Vec<(&str, TestFn)> = tests![
        pipes_are_read_and_written_while_the_command_runs,
        the_environment_is_only_what_the_caller_set,
        the_command_runs_under_the_policy,
        a_signal_reaches_the_command_and_not_the_launcher,
        signals_the_caller_ignored_are_the_commands_to_trap,
        kill_tree_ends_every_process_of_the_command,
        a_dropped_handle_ends_the_tree,
        a_refusal_says_why_and_nothing_runs,
        a_shell_command_runs_to_completion_and_its_timeout_ends_the_tree,
    ];
    // Private terminals are Linux's (a devpts instance of the command's own).
    #[cfg(target_os = "linux")]
    let tests = {
        let mut tests = tests;
        tests.extend(tests![
            private_terminals_give_a_pty_and_none_of_the_machines,
            without_private_terminals_no_terminal_opens,
            where_private_terminals_cannot_be_made_there_is_no_terminal_and_stderr_says_so,
            one_commands_terminal_is_out_of_reach_of_another,
        ]);
        tests
    };
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut failed = Vec::new();
    let mut passed = 0;
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| block_on(test())));
        match result {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(name);
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

/// Each test on a runtime of its own, its future on this (the main) thread: a launcher is sent
/// SIGTERM when the thread that spawned it ends, and this one lives as long as the run.
fn block_on(test: Test) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}
