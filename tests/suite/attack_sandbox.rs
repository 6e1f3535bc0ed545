//! Attacks on the laptop sandbox's launcher layers (issue 10, items 1, 2, 4 and 9), each
//! performed for real against the real binaries, with a control showing the same act works
//! outside the sandbox:
//!
//! - the person's terminal: `TIOCSTI` into the shell that started the executor, on a real pty,
//!   and another terminal of the same user;
//! - Unix sockets: a real ssh-agent, an abstract socket of a process outside, a datagram pair
//!   re-aimed at a named socket, io_uring, and the operator sockets of a same-user quickstart;
//! - a fork-hopping chain that must be gone 1 s after its result, with and without a delegated
//!   cgroup (emulated: a cgroup v2 directory chowned to the laptop user, as `Delegate=yes` does);
//! - a fork bomb under `--max-processes`, with the executor alive after it.
//!
//! The laptop runs as an unprivileged test user wherever the kernel treats root differently
//! (`TIOCSTI` and `RLIMIT_NPROC` do not bind root).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentworks_laptop::shell::{self, ShellOutcome, ShellRequest};
use agentworks_sandbox::{self as sandbox, CommandLimits, SandboxPolicy};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::harness::{
    Client, DelegatedCgroup, Gatewayd, Laptop, QuickstartRun, Stack, Start, as_user, block_on,
    chown_tree, ensure_user, processes_with, quickstart_args, reserve_ports, tasks_of, users_lock,
    wait_until,
};
use agentworks_support::unix_http::UnixClient;

/// A bounded wait for something that must happen.
const WAIT: Duration = Duration::from_secs(20);
const PYTHON: &str = "/usr/bin/python3";

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

fn launcher() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_agentworks"))
}

fn require(path: &str, package: &str) {
    assert!(
        Path::new(path).exists(),
        "{path} is missing: these tests need it (apt-get install {package})"
    );
}

// ----- the launcher alone, through the shell runner (as root) -----

/// A writable project and a scratch dir, nothing else.
struct Folder {
    _dir: tempfile::TempDir,
    root: PathBuf,
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
        Folder {
            _dir: dir,
            root,
            project,
            scratch,
        }
    }

    fn request(&self, command: &str, limits: CommandLimits, env: &[(&str, &str)]) -> ShellRequest {
        ShellRequest {
            command: command.to_owned(),
            timeout: Some(Duration::from_secs(60)),
            policy: SandboxPolicy {
                pinned: vec![],
                read_write: vec![self.project.clone()],
                read_only: vec![],
                blocked: vec![],
                read_only_within: vec![],
                denied: vec![],
                read_only_if_present: vec![],
                scratch: self.scratch.clone(),
                cwd: self.project.clone(),
                limits,
                overmount_exclusions: true,
                private_terminals: false,
            },
            env_extra: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }
}

async fn sandboxed(request: ShellRequest) -> ShellOutcome {
    shell::run(launcher(), request, CancellationToken::new())
        .await
        .unwrap()
}

fn allowing_unix_sockets() -> CommandLimits {
    CommandLimits {
        allow_unix_sockets: true,
        ..CommandLimits::default()
    }
}

/// The same command outside the sandbox (control), as root.
fn unsandboxed(command: &str, env: &[(&str, &str)]) -> std::process::Output {
    Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A real ssh-agent (`ssh-agent -D -a <socket>`) holding a fresh key; killed on drop.
struct SshAgent {
    child: Child,
    socket: PathBuf,
    fingerprint: String,
}

impl SshAgent {
    fn start(dir: &Path) -> SshAgent {
        require("/usr/bin/ssh-agent", "openssh-client");
        let key = dir.join("id_ed25519");
        let out = Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "attack-fixture",
                "-f",
            ])
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
        let out = Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&key)
            .output()
            .unwrap();
        let fingerprint = text(&out.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned();
        let socket = dir.join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("ssh-agent listens", WAIT, || socket.exists());
        let out = Command::new("ssh-add")
            .arg(&key)
            .env("SSH_AUTH_SOCK", &socket)
            .output()
            .unwrap();
        assert!(out.status.success(), "ssh-add: {}", text(&out.stderr));
        SshAgent {
            child,
            socket,
            fingerprint,
        }
    }
}

impl Drop for SshAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_command_cannot_reach_the_persons_ssh_agent() {
    let f = Folder::new();
    let agent_dir = f.root.join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    let agent = SshAgent::start(&agent_dir);
    let socket = agent.socket.to_str().unwrap();
    let env = [("SSH_AUTH_SOCK", socket)];

    // Control: outside the sandbox the agent lists the key.
    let control = unsandboxed("ssh-add -l", &env);
    assert!(
        text(&control.stdout).contains(&agent.fingerprint),
        "control: {control:?}"
    );

    // Inside, the agent's socket is out of reach, although connect() to a named socket is not a
    // path Landlock below ABI 9 governs: creating the socket is refused.
    let out = sandboxed(f.request("ssh-add -l", CommandLimits::default(), &env)).await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!out.stdout.contains(&agent.fingerprint), "{out:?}");
    // Nor by signing with it (what the attack did with the key).
    let pubkey = agent_dir.join("id_ed25519.pub");
    std::fs::copy(&pubkey, f.project.join("key.pub")).unwrap();
    std::fs::write(f.project.join("data"), "to sign").unwrap();
    let out = sandboxed(f.request(
        "ssh-keygen -Y sign -f key.pub -n file data",
        CommandLimits::default(),
        &env,
    ))
    .await;
    assert_ne!(out.exit_code, Some(0), "{out:?}");
    assert!(!f.project.join("data.sig").exists());

    // --allow-unix-sockets is what it says: the same command then reaches the agent.
    let out = sandboxed(f.request("ssh-add -l", allowing_unix_sockets(), &env)).await;
    assert!(out.stdout.contains(&agent.fingerprint), "{out:?}");
}

/// Connects to the abstract socket `argv[1]` and prints what it answers.
const ABSTRACT_CLIENT: &str = r#"
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + sys.argv[1])
except OSError as e:
    print("refused:", e)
    sys.exit(3)
print(s.recv(100).decode())
"#;

#[tokio::test]
async fn a_command_cannot_reach_an_abstract_socket_outside_the_sandbox() {
    use std::os::linux::net::SocketAddrExt;
    let abi = sandbox::landlock_status().unwrap();
    assert!(
        abi >= 6,
        "this machine's Landlock ABI {abi} has no abstract-socket scope (Linux 6.12+)"
    );
    let f = Folder::new();
    std::fs::write(f.project.join("client.py"), ABSTRACT_CLIENT).unwrap();
    let name = unique("aw-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let served = Arc::new(AtomicU64::new(0));
    std::thread::spawn({
        let served = Arc::clone(&served);
        move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                served.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(b"hello-from-outside");
            }
        }
    });

    // Control: a process outside reaches it.
    let control = Command::new(PYTHON)
        .arg(f.project.join("client.py"))
        .arg(&name)
        .output()
        .unwrap();
    assert!(
        text(&control.stdout).contains("hello-from-outside"),
        "{control:?}"
    );
    let before = served.load(Ordering::SeqCst);

    // Inside, refused: by the seccomp filter by default, and by the Landlock scope even when
    // the person allowed Unix sockets.
    for limits in [CommandLimits::default(), allowing_unix_sockets()] {
        let out =
            sandboxed(f.request(&format!("{PYTHON} client.py {name}"), limits.clone(), &[])).await;
        assert_eq!(out.exit_code, Some(3), "{limits:?}: {out:?}");
        assert!(!out.stdout.contains("hello-from-outside"), "{out:?}");
    }
    assert_eq!(
        served.load(Ordering::SeqCst),
        before,
        "the listener was reached"
    );

    // A command's own abstract socket still works (the scope is about the outside only).
    let own = format!(
        "{PYTHON} -c 'import socket,threading\n\
         l=socket.socket(socket.AF_UNIX);l.bind(\"\\0{name}-own\");l.listen()\n\
         threading.Thread(target=lambda:l.accept()[0].send(b\"own-ok\")).start()\n\
         c=socket.socket(socket.AF_UNIX);c.connect(\"\\0{name}-own\");print(c.recv(9).decode())'"
    );
    let out = sandboxed(f.request(&own, allowing_unix_sockets(), &[])).await;
    assert_eq!(out.stdout.trim(), "own-ok", "{out:?}");
}

/// `socketpair` of `argv[1]` (`stream` or `dgram`); a datagram pair is then aimed at the named
/// socket `argv[2]`.
const SOCKETPAIR: &str = r#"
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == "stream" else socket.SOCK_DGRAM
try:
    a, b = socket.socketpair(socket.AF_UNIX, kind)
except OSError as e:
    print("refused:", e)
    sys.exit(3)
if kind == socket.SOCK_STREAM:
    a.send(b"pair-ok")
    print(b.recv(10).decode())
else:
    a.sendto(b"reaimed", sys.argv[2])
    print("sent")
"#;

#[tokio::test]
async fn a_datagram_socketpair_cannot_be_aimed_at_a_named_socket_but_stream_pairs_work() {
    let f = Folder::new();
    std::fs::write(f.project.join("pair.py"), SOCKETPAIR).unwrap();
    let named = f.root.join("dgram.sock");
    let receiver = std::os::unix::net::UnixDatagram::bind(&named).unwrap();
    receiver
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let target = named.to_str().unwrap();

    // Control: outside, a datagram pair re-aimed with sendto() reaches the named socket.
    let control = Command::new(PYTHON)
        .arg(f.project.join("pair.py"))
        .args(["dgram", target])
        .output()
        .unwrap();
    assert!(text(&control.stdout).contains("sent"), "{control:?}");
    let mut buf = [0u8; 16];
    let n = receiver.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"reaimed");

    let out = sandboxed(f.request(
        &format!("{PYTHON} pair.py dgram {target}"),
        CommandLimits::default(),
        &[],
    ))
    .await;
    assert_eq!(out.exit_code, Some(3), "{out:?}");
    receiver
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(
        receiver.recv(&mut buf).is_err(),
        "the named socket was reached"
    );

    // Stream pairs (and pipelines) keep working.
    let out = sandboxed(f.request(
        &format!("{PYTHON} pair.py stream && echo piped | tr a-z A-Z"),
        CommandLimits::default(),
        &[],
    ))
    .await;
    assert_eq!(out.stdout, "pair-ok\nPIPED\n", "{out:?}");
}

/// `io_uring_setup(4, params)`: prints the fd or the error.
const IO_URING: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 4, params)
if fd < 0:
    print("refused:", os.strerror(ctypes.get_errno()))
    sys.exit(3)
print("io_uring fd", fd)
"#;

#[tokio::test]
async fn io_uring_cannot_be_set_up_in_the_sandbox() {
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "0".into()),
        "0",
        "io_uring is disabled on this machine, so the control cannot run"
    );
    let f = Folder::new();
    std::fs::write(f.project.join("uring.py"), IO_URING).unwrap();
    let control = Command::new(PYTHON)
        .arg(f.project.join("uring.py"))
        .output()
        .unwrap();
    assert!(text(&control.stdout).contains("io_uring fd"), "{control:?}");
    let out =
        sandboxed(f.request(&format!("{PYTHON} uring.py"), CommandLimits::default(), &[])).await;
    assert_eq!(out.exit_code, Some(3), "{out:?}");
    assert!(out.stdout.contains("Operation not permitted"), "{out:?}");
}

/// The fork-hopping chain of the attack, in C (a hop is a fork of a tiny process, far faster
/// than a scan of /proc): a new session, then fork and let the parent exit, forever.
const HOPPER: &str = r#"
#include <unistd.h>
int main(void) {
    setsid();
    for (;;)
        if (fork() != 0)
            _exit(0);
}
"#;

/// Compiles [`HOPPER`] into `dir/<name>` (outside the sandbox); `name` (at most 15 bytes) is
/// then the command name (`comm`) of every hop, zombies included.
fn build_hopper(dir: &Path, name: &str) {
    require("/usr/bin/cc", "gcc");
    assert!(name.len() <= 15, "{name} is longer than a comm");
    std::fs::write(dir.join("hopper.c"), HOPPER).unwrap();
    let out = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(dir.join(name))
        .arg(dir.join("hopper.c"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cc: {}", text(&out.stderr));
}

/// A name for one test's hopper binary.
fn hopper_name() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("hop{}-{n}", std::process::id() % 100_000)
}

/// Kills whatever is left of a chain named `comm` when a test ends, passed or failed: a chain
/// that got out (against a launcher without the fix, or a failing test) would otherwise fork
/// forever and starve every later test and build on the machine. A hop cannot be caught by
/// its pid (it is gone a moment later), but the whole chain shares the process group its first
/// hop made with `setsid`, and one `kill(-pgid)` reaches every member at once.
struct ChainReaper {
    comm: String,
}

impl Drop for ChainReaper {
    fn drop(&mut self) {
        for _ in 0..50 {
            let groups: std::collections::BTreeSet<i32> = process_groups_named(&self.comm);
            if groups.is_empty() {
                return;
            }
            for group in groups {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = writeln!(
            std::io::stderr(),
            "the chain {} is still alive after 50 rounds of kill(-pgid)",
            self.comm
        );
    }
}

/// The process groups of every live process named `comm` (zombies have no one left to kill).
fn process_groups_named(comm: &str) -> std::collections::BTreeSet<i32> {
    let mut groups = std::collections::BTreeSet::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return groups;
    };
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if head.split_once(" (").map(|(_, c)| c) != Some(comm) {
            continue;
        }
        // After the comm: state, ppid, pgrp.
        let fields: Vec<&str> = rest.split_whitespace().take(3).collect();
        if let [state, _, pgrp] = fields[..]
            && state != "Z"
            && let Ok(pgrp) = pgrp.parse::<i32>()
            && pgrp > 1
        {
            groups.insert(pgrp);
        }
    }
    groups
}

/// The command that starts the chain.
fn hopping_chain(name: &str) -> String {
    format!("./{name} & sleep 300")
}

/// Every process named `comm`, live or zombie, as `"<pid> <state> ppid <ppid>"`. A chain that
/// escaped to an init that does not reap leaves zombies, so they count.
fn processes_named(comm: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if head.split_once(" (").map(|(_, c)| c) == Some(comm) {
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("?");
            let ppid = fields.next().unwrap_or("?");
            found.push(format!(
                "{} {state} ppid {ppid}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// No live process carries `marker` in its command line 1 s after the result.
fn assert_gone_a_second_after(marker: &str, result_at: Instant) {
    std::thread::sleep(Duration::from_secs(1).saturating_sub(result_at.elapsed()));
    let left = processes_with(marker);
    assert!(
        left.is_empty(),
        "the command's processes outlived its result by 1 s: {left:?}"
    );
}

/// No process of the chain (live or zombie) exists 1 s after the result.
fn assert_chain_gone_a_second_after(comm: &str, result_at: Instant) {
    std::thread::sleep(Duration::from_secs(1).saturating_sub(result_at.elapsed()));
    let left = processes_named(comm);
    assert!(
        left.is_empty(),
        "{} processes of the chain outlived its result by 1 s: {:?}",
        left.len(),
        &left[..left.len().min(5)]
    );
}

// ----- the whole laptop as an unprivileged user, through gatewayd -----

/// The laptop user (`awtest-laptop`, or another name for a test that must not share its
/// process count): uid and gid.
fn laptop_user(name: &str) -> (u32, u32) {
    let _lock = users_lock();
    ensure_user(name, &[])
}

/// A stack (agentd, workspaced, gatewayd, as root), a person with a `devices:connect` token,
/// and a laptop owned by the unprivileged `uid`, logged in. Drops the executor first.
struct UserLaptop {
    executor: Option<Child>,
    gw: Gatewayd,
    /// agentd and workspaced, which gatewayd needs while the laptop runs.
    _stack: Stack,
    laptop: Laptop,
    uid: u32,
    gid: u32,
    user_id: String,
    output: PathBuf,
}

impl UserLaptop {
    fn start(user: &str) -> UserLaptop {
        let (uid, gid) = laptop_user(user);
        let (stack, gw_port) = Stack::start_with_gateway();
        let gw = Gatewayd::start(&stack, gw_port);
        let name = unique("alice");
        let _ = stack.admin_raw("users/add", json!({"name": name}));
        let created = stack.admin(
            "tokens/create",
            json!({"user": name, "scopes": ["devices:connect"]}),
        );
        let user_id = created["info"]["user_id"].as_str().unwrap().to_owned();
        let token = created["token"].as_str().unwrap().to_owned();
        let laptop = Laptop::new(
            "aw-attack-",
            &[
                ("src/repo/readme.txt", "readme\n"),
                (".ssh/id_ed25519", "PRIVATE-KEY-FIXTURE"),
            ],
        );
        chown_tree(&laptop.root(), uid, gid);
        login(&laptop, &stack, gw_port, &token, uid, gid);
        let output = laptop.root().join("executor-output");
        UserLaptop {
            executor: None,
            gw,
            _stack: stack,
            laptop,
            uid,
            gid,
            user_id,
            output,
        }
    }

    fn grants(&self) -> Vec<String> {
        vec![
            "--write-folder".into(),
            self.laptop.folder("repo").to_str().unwrap().to_owned(),
        ]
    }

    /// `agentworks executor connect` as the user, its stdout and stderr in one file.
    fn connect(&mut self, extra: &[&str], start: Start) {
        let mut args = vec!["executor", "connect", "--name", "laptop"];
        let grants = self.grants();
        args.extend(grants.iter().map(String::as_str));
        args.extend_from_slice(extra);
        let out = std::fs::File::create(&self.output).unwrap();
        let mut command = self.laptop.command(&args);
        command.stdout(out.try_clone().unwrap()).stderr(out);
        as_user(&mut command, self.uid, self.gid, start);
        self.executor = Some(command.spawn().unwrap());
        self.wait_online();
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    fn client(&self) -> Client {
        self.gw.client()
    }

    fn device_id(&self) -> Option<String> {
        let devices = self
            .client()
            .json("/v1/devices", json!({"user_id": self.user_id}))
            .unwrap();
        devices
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["online"] == true)
            .map(|d| d["device_id"].as_str().unwrap().to_owned())
    }

    fn wait_online(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(id) = self.device_id() {
                return id;
            }
            assert!(
                Instant::now() < deadline,
                "the device did not come online; executor output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A shell command on the `repo` folder; returns the outcome (which must be completed).
    fn run(&self, command: &str, timeout: Option<u64>) -> Value {
        let body = json!({"user_id": self.user_id, "device_id": self.wait_online(),
            "folder": "repo", "request_id": unique("req"),
            "operation": {"kind": "execute_shell_command", "command": command, "timeout": timeout}});
        let answer = self
            .client()
            .json("/v1/dispatch", body)
            .unwrap_or_else(|e| panic!("{command}: {e:?}"));
        assert_eq!(answer["state"], "done", "{command}: {answer}");
        assert_eq!(
            answer["outcome"]["status"], "completed",
            "{command}: {answer}"
        );
        answer["outcome"].clone()
    }

    fn executor_alive(&mut self) -> bool {
        matches!(self.executor.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for UserLaptop {
    fn drop(&mut self) {
        if let Some(mut child) = self.executor.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn login(laptop: &Laptop, stack: &Stack, gw_port: u16, token: &str, uid: u32, gid: u32) {
    let server = format!("http://127.0.0.1:{}", stack.port);
    let gateway = format!("ws://127.0.0.1:{gw_port}");
    let mut command = laptop.command(&[
        "login",
        "--server",
        &server,
        "--gateway",
        &gateway,
        "--with-token",
    ]);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    as_user(&mut command, uid, gid, Start::default());
    let mut child = command.spawn().unwrap();
    writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "login: {}", text(&out.stderr));
}

fn stdout(outcome: &Value) -> &str {
    outcome["stdout"].as_str().unwrap_or_default()
}

#[test]
fn a_fork_bomb_hits_the_process_limit_and_the_executor_survives() {
    // Its own user, so that no other test's processes count against the limit.
    let mut setup = UserLaptop::start("awtest-forkbomb");
    let cgroup = DelegatedCgroup::new(setup.uid, setup.gid);
    setup.connect(
        &["--max-processes", "64", "--max-memory", "256M"],
        Start {
            cgroup: Some(cgroup.path.clone()),
            terminal: false,
        },
    );
    let connect_text = setup.output();
    assert!(
        connect_text.contains("at most 64 more processes than your user runs"),
        "{connect_text}"
    );
    assert!(
        connect_text.contains(&format!(
            "in a cgroup of its own under {}",
            cgroup.path.display()
        )),
        "{connect_text}"
    );

    // Each command runs in a cgroup of its own.
    let own = setup.run("cat /proc/self/cgroup", None);
    assert!(stdout(&own).contains("/agentworks-command-"), "{own}");

    // A real fork bomb, for 4 s: it hits RLIMIT_NPROC, the count stays within the limit, and
    // the executor serves the next command.
    let marker = unique("forkbomb");
    let before = tasks_of(setup.uid);
    let peak = Arc::new(AtomicU64::new(before));
    let sampling = Arc::new(Mutex::new(true));
    let sampler = std::thread::spawn({
        let (peak, sampling, uid) = (Arc::clone(&peak), Arc::clone(&sampling), setup.uid);
        move || {
            while *sampling.lock().unwrap() {
                peak.fetch_max(tasks_of(uid), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    // The shell forks its `sleep`, then the bomb once, in a subshell, and then only waits (a
    // builtin): a shell whose own fork fails at the limit exits, and the command would end
    // before its timeout. (Run directly, `bomb | bomb &` is two forks of the shell itself, and
    // the first half can use up the limit before the second.)
    let bomb = format!(": {marker}; bomb() {{ bomb | bomb & }}; sleep 30 & s=$!; (bomb) & wait $s");
    let outcome = setup.run(&bomb, Some(4));
    let result_at = Instant::now();
    *sampling.lock().unwrap() = false;
    sampler.join().unwrap();
    assert_eq!(outcome["timed_out"], true, "{outcome}");
    let stderr = outcome["stderr"].as_str().unwrap_or_default();
    assert!(
        stderr.contains("fork") || stderr.contains("Resource temporarily unavailable"),
        "the bomb never hit the limit: {outcome}"
    );
    let peak = peak.load(Ordering::SeqCst);
    eprintln!("fork bomb: user tasks before {before}, peak {peak} (limit: +64)");
    // The executor's own threads may grow by a few meanwhile (tokio's blocking pool).
    assert!(peak <= before + 64 + 16, "peak {peak}, before {before}");
    assert!(setup.executor_alive(), "{}", setup.output());
    assert_gone_a_second_after(&marker, result_at);
    assert_eq!(stdout(&setup.run("echo alive", None)), "alive\n");

    // memory.max needs the memory controller in the delegated cgroup.
    let controllers = cgroup.controllers();
    if controllers.split_whitespace().any(|c| c == "memory") {
        assert!(
            connect_text.contains("with at most 256.0 MiB of memory (memory.max)"),
            "{connect_text}"
        );
        let hog = format!("{PYTHON} -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'");
        let outcome = setup.run(&hog, Some(60));
        assert_ne!(outcome["exit_code"], 0, "{outcome}");
        assert_eq!(outcome["timed_out"], false, "{outcome}");
        assert!(setup.executor_alive(), "{}", setup.output());
        assert_eq!(stdout(&setup.run("echo alive", None)), "alive\n");
    } else {
        // The product names the missing limit at connect...
        assert!(
            connect_text.contains("NO memory limit") && connect_text.contains("memory controller"),
            "{connect_text}"
        );
        // ...and this part of the test cannot run here. Written to the process's stderr
        // directly, past the test harness's output capture, so that it shows in a passing run.
        let _ = writeln!(
            std::io::stderr(),
            "\n*** NOT RUN: memory.max under a memory hog (suite::attack_sandbox::\
             a_fork_bomb_hits_the_process_limit_and_the_executor_survives): the cgroup v2 \
             hierarchy of this machine has no memory controller (cgroup.controllers of the \
             delegated cgroup: {:?}) ***",
            controllers.trim()
        );
    }
}

/// The hopping chain through the real executor, as the unprivileged laptop user, in a
/// delegated cgroup or not.
fn hopping_chain_is_gone_a_second_after_its_timeout(delegated: bool) {
    let mut setup = UserLaptop::start("awtest-laptop");
    let cgroup = delegated.then(|| DelegatedCgroup::new(setup.uid, setup.gid));
    setup.connect(
        &[],
        Start {
            cgroup: cgroup.as_ref().map(|c| c.path.clone()),
            terminal: false,
        },
    );
    let repo = setup.laptop.folder("repo");
    let name = hopper_name();
    build_hopper(&repo, &name);
    let _reaper = ChainReaper { comm: name.clone() };
    chown_tree(&repo, setup.uid, setup.gid);
    let started = Instant::now();
    let outcome = setup.run(&hopping_chain(&name), Some(2));
    let result_at = Instant::now();
    assert_eq!(outcome["timed_out"], true, "{outcome}");
    let _ = writeln!(
        std::io::stderr(),
        "hopping chain (delegated cgroup: {delegated}): result {:?} after the dispatch, timeout 2 s",
        result_at - started
    );
    assert_chain_gone_a_second_after(&name, result_at);
    if let Some(cgroup) = &cgroup {
        // The command's cgroup is removed with it.
        let left: Vec<_> = std::fs::read_dir(&cgroup.path)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("agentworks-command-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    assert!(setup.executor_alive(), "{}", setup.output());
}

#[test]
fn a_fork_hopping_chain_is_gone_a_second_after_its_timeout() {
    hopping_chain_is_gone_a_second_after_its_timeout(false);
}

#[test]
fn a_fork_hopping_chain_in_a_delegated_cgroup_is_gone_a_second_after_its_timeout() {
    hopping_chain_is_gone_a_second_after_its_timeout(true);
}

#[test]
fn without_a_delegated_cgroup_connect_names_the_missing_memory_limit() {
    let mut setup = UserLaptop::start("awtest-laptop");
    setup.connect(&[], Start::default());
    let text = setup.output();
    assert!(text.contains("NO memory limit"), "{text}");
    assert!(
        text.contains("systemd-run --user --scope -p Delegate=yes"),
        "{text}"
    );
    assert!(text.contains("without Unix sockets"), "{text}");
    assert!(text.contains("without a terminal"), "{text}");
}

// ----- a same-user quickstart -----

/// `agentworksctl quickstart` as `uid:gid` on `state`; returns the child and its JSON line.
fn quickstart_as(state: &Path, uid: u32, gid: u32) -> (Child, Value) {
    let ports = reserve_ports(2);
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworksctl"));
    command
        .args(quickstart_args(state, [ports[0], ports[1]]))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", state)
        .stdin(Stdio::null());
    as_user(&mut command, uid, gid, Start::default());
    let run = QuickstartRun::spawn(command);
    run.into_parts()
}

#[test]
fn a_command_cannot_reach_the_operator_sockets_of_a_same_user_quickstart() {
    require("/usr/bin/curl", "curl");
    let (uid, gid) = laptop_user("awtest-laptop");
    let dir = tempfile::Builder::new()
        .prefix("aw-qs-same-user-")
        .tempdir()
        .unwrap();
    chown_tree(dir.path(), uid, gid);
    let state = dir.path().join("qs");
    let (quickstart, started) = quickstart_as(&state, uid, gid);
    struct Stop(Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.0.wait();
        }
    }
    let quickstart = Stop(quickstart);
    let agentd_sock = PathBuf::from(started["agentd_socket"].as_str().unwrap());
    let workspaced_sock = PathBuf::from(started["workspaced_socket"].as_str().unwrap());
    let gatewayd_sock = state.canonicalize().unwrap().join("run/gatewayd.sock");

    // A person with a devices:connect token, minted on agentd's operator socket.
    let admin = UnixClient::new(&agentd_sock);
    let name = unique("bob");
    let _: Result<Value, _> = block_on(admin.post("/v1/admin/users/add", &json!({"name": name})));
    let created: Value = block_on(admin.post(
        "/v1/admin/tokens/create",
        &json!({"user": name, "scopes": ["devices:connect"]}),
    ))
    .unwrap();
    let user_id = created["info"]["user_id"].as_str().unwrap().to_owned();

    // The laptop of the same user as the daemons.
    let laptop = Laptop::new("aw-qs-laptop-", &[("src/repo/readme.txt", "readme\n")]);
    chown_tree(&laptop.root(), uid, gid);
    let server = started["api_url"].as_str().unwrap().to_owned();
    let gateway = started["gateway_url"].as_str().unwrap().to_owned();
    let mut login = laptop.command(&[
        "login",
        "--server",
        &server,
        "--gateway",
        &gateway,
        "--with-token",
    ]);
    login
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    as_user(&mut login, uid, gid, Start::default());
    let mut child = login.spawn().unwrap();
    writeln!(
        child.stdin.take().unwrap(),
        "{}",
        created["token"].as_str().unwrap()
    )
    .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let output = laptop.root().join("executor-output");
    let out = std::fs::File::create(&output).unwrap();
    let mut connect = laptop.command(&[
        "executor",
        "connect",
        "--write-folder",
        laptop.folder("repo").to_str().unwrap(),
    ]);
    connect.stdout(out.try_clone().unwrap()).stderr(out);
    as_user(&mut connect, uid, gid, Start::default());
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _executor = Kill(connect.spawn().unwrap());
    let gw = Client {
        inner: UnixClient::new(&gatewayd_sock),
    };
    let mut device_id = None;
    wait_until("the quickstart laptop is online", WAIT, || {
        let devices = gw.json("/v1/devices", json!({"user_id": user_id})).unwrap();
        device_id = devices
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["online"] == true)
            .map(|d| d["device_id"].as_str().unwrap().to_owned());
        device_id.is_some()
    });
    let run = |command: &str| -> Value {
        let answer = gw
            .json(
                "/v1/dispatch",
                json!({"user_id": user_id, "device_id": device_id, "folder": "repo",
                    "request_id": unique("req"),
                    "operation": {"kind": "execute_shell_command", "command": command}}),
            )
            .unwrap();
        assert_eq!(answer["outcome"]["status"], "completed", "{answer}");
        answer["outcome"].clone()
    };

    // What the attack did: mint a workflows:write token on agentd's operator socket, and talk
    // to workspaced directly.
    let mint = |sock: &Path| {
        format!(
            "curl -sS --max-time 10 --unix-socket {} -X POST -H 'content-type: application/json' \
             -d '{{\"user\": \"demo\", \"scopes\": [\"workflows:write\"]}}' http://_/v1/admin/tokens/create",
            sock.display()
        )
    };
    let health = |sock: &Path| {
        format!(
            "curl -sS --max-time 10 --unix-socket {} http://_/v1/health",
            sock.display()
        )
    };
    // Control: the same user outside the sandbox reaches both.
    let control = |command: &str| {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(command).stdin(Stdio::null());
        as_user(&mut c, uid, gid, Start::default());
        c.output().unwrap()
    };
    let minted = control(&mint(&agentd_sock));
    assert!(
        text(&minted.stdout).contains("\"token\""),
        "control: {minted:?}"
    );
    let healthy = control(&health(&workspaced_sock));
    assert!(healthy.status.success(), "control: {healthy:?}");

    let tokens_before: Value =
        block_on(admin.post("/v1/admin/tokens/list", &json!({"user": "demo"}))).unwrap();
    for command in [
        mint(&agentd_sock),
        health(&agentd_sock),
        health(&workspaced_sock),
        health(&gatewayd_sock),
    ] {
        let outcome = run(&command);
        assert_ne!(outcome["exit_code"], 0, "{command}: {outcome}");
        assert!(!stdout(&outcome).contains("token"), "{command}: {outcome}");
    }
    let tokens_after: Value =
        block_on(admin.post("/v1/admin/tokens/list", &json!({"user": "demo"}))).unwrap();
    assert_eq!(
        tokens_before, tokens_after,
        "a token was minted from the sandbox"
    );
    drop(quickstart);
}

// ----- the person's terminal -----

/// Pushes `argv[2]` and a newline into the terminal `argv[1]` with TIOCSTI, as typed input.
const TIOCSTI: &str = r#"
import fcntl, os, sys, termios
try:
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY)
    for ch in (sys.argv[2] + "\n").encode():
        fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
except OSError as e:
    print("refused:", e)
    sys.exit(3)
print("injected")
"#;

/// Reads what was typed into the terminal `argv[1]` and draws a fake prompt on it.
const OTHER_TERMINAL: &str = r#"
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    os.write(fd, b"\r\nPassword for sudo: ")
    print("read:", os.read(fd, 200))
except OSError as e:
    print("refused:", e)
    sys.exit(3)
"#;

/// A pty pair (`openpty`) whose slave belongs to `uid:gid`, as a login terminal's does.
pub(super) fn user_pty(uid: u32, gid: u32) -> (OwnedFd, OwnedFd, PathBuf) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors into the two valid out-pointers; the name, termios
    // and window-size pointers may be NULL.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let name = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd())).unwrap();
    // SAFETY: fchown on a descriptor we own.
    assert_eq!(unsafe { libc::fchown(slave.as_raw_fd(), uid, gid) }, 0);
    (master, slave, name)
}

/// Everything the master side of a pty receives, collected on a thread.
pub(super) fn drain(master: &OwnedFd) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let mut file = std::fs::File::from(master.try_clone().unwrap());
    std::thread::spawn({
        let seen = Arc::clone(&seen);
        move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().push_str(&text(&buf[..n]));
            }
        }
    });
    seen
}

pub(super) fn type_into(master: &OwnedFd, line: &str) {
    let mut file = std::fs::File::from(master.try_clone().unwrap());
    file.write_all(line.as_bytes()).unwrap();
}

#[test]
fn a_command_cannot_type_into_the_persons_shell_or_use_their_other_terminals() {
    require(PYTHON, "python3");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "1".into()),
        "1",
        "TIOCSTI is disabled on this machine (dev.tty.legacy_tiocsti = 0), so the control cannot run"
    );
    let setup = UserLaptop::start("awtest-laptop");
    let repo = setup.laptop.folder("repo");
    std::fs::write(repo.join("tiocsti.py"), TIOCSTI).unwrap();
    std::fs::write(repo.join("other.py"), OTHER_TERMINAL).unwrap();
    chown_tree(&repo, setup.uid, setup.gid);
    let evidence = setup.laptop.root().join("evidence");
    std::fs::create_dir(&evidence).unwrap();
    chown_tree(&evidence, setup.uid, setup.gid);

    // The person's terminal, with their interactive shell on it, and another terminal of
    // theirs with a line typed into it that nobody has read yet.
    let (master, slave, pts) = user_pty(setup.uid, setup.gid);
    let (other_master, other_slave, other_pts) = user_pty(setup.uid, setup.gid);
    let screen = drain(&master);
    let other_screen = drain(&other_master);
    type_into(&other_master, "typed-in-the-other-terminal\n");
    let mut shell = Command::new("/bin/sh");
    shell
        .arg("-i")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", setup.laptop.home())
        .env("XDG_CONFIG_HOME", setup.laptop.config_home())
        .env("XDG_STATE_HOME", setup.laptop.state_home())
        .env("PS1", "$ ")
        .current_dir(setup.laptop.home())
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    as_user(
        &mut shell,
        setup.uid,
        setup.gid,
        Start {
            cgroup: None,
            terminal: true,
        },
    );
    let mut shell = shell.spawn().unwrap();
    // Kept to look into the input queue the shell reads from.
    let queue = slave;
    let shell_pid = shell.id();

    // Control: from an unsandboxed child of that shell, TIOCSTI works: the typed line runs.
    let control = evidence.join("control");
    type_into(
        &master,
        &format!(
            "{PYTHON} {} /dev/tty 'touch {}'\n",
            repo.join("tiocsti.py").display(),
            control.display()
        ),
    );
    wait_until("the injected control line ran in the shell", WAIT, || {
        control.exists()
    });
    // The file can exist before the reader thread has copied the control's own "injected"
    // off the terminal: wait for it, so that what follows on the screen is the commands' only.
    wait_until("the control's output reached the screen", WAIT, || {
        screen.lock().unwrap().contains("injected")
    });
    let control_screen = screen.lock().unwrap().len();

    // The executor, started from that shell as a person would.
    let grants = setup.grants().join(" ");
    type_into(
        &master,
        &format!(
            "{} executor connect --name laptop {grants}\n",
            launcher().display()
        ),
    );
    setup.wait_online();

    // The command has no controlling terminal (tty_nr, the 7th field of its stat, is 0),
    // although the executor that runs it has one.
    let tty_nr = |stat: &str| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(4))
            .unwrap_or_default()
            .to_owned()
    };
    let executor_stat =
        std::fs::read_to_string(format!("/proc/{}/stat", children_of(shell_pid)[0])).unwrap();
    assert_ne!(tty_nr(&executor_stat), "0", "{executor_stat}");
    let outcome = setup.run("cat /proc/self/stat", None);
    assert_eq!(tty_nr(stdout(&outcome)), "0", "{outcome}");

    let attempts = [
        ("tty", "/dev/tty".to_owned()),
        ("pts", pts.display().to_string()),
        ("proc", format!("/proc/{shell_pid}/fd/0")),
    ];
    for (what, terminal) in &attempts {
        let outcome = setup.run(
            &format!(
                "{PYTHON} tiocsti.py {terminal} 'touch {}'",
                evidence.join(format!("pwned-{what}")).display()
            ),
            None,
        );
        assert_eq!(outcome["exit_code"], 3, "{what}: {outcome}");
        assert!(stdout(&outcome).contains("refused"), "{what}: {outcome}");
    }
    let outcome = setup.run(&format!("{PYTHON} other.py {}", other_pts.display()), None);
    assert_eq!(outcome["exit_code"], 3, "{outcome}");
    assert!(
        !outcome.to_string().contains("typed-in-the-other"),
        "{outcome}"
    );

    // Nothing is queued as typed input for the shell...
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCINQ writes the input queue's length into the valid int it is given.
    let rc = unsafe { libc::ioctl(queue.as_raw_fd(), libc::TIOCINQ, &mut queued) };
    assert_eq!(rc, 0);
    assert_eq!(queued, 0, "input was pushed into the person's terminal");
    // ...and when the executor ends (SIGTERM, as from another terminal: Ctrl-C would flush the
    // input queue) the shell reads what is: an injected line would run now, before this one.
    let executor = children_of(shell_pid);
    assert_eq!(executor.len(), 1, "{executor:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(executor[0]),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_until("the executor ended", WAIT, || {
        !setup.executor_alive_by_device() && children_of(shell_pid).is_empty()
    });
    type_into(&master, "echo finished-$((6*7))\n");
    wait_until("the shell answered", WAIT, || {
        screen.lock().unwrap().contains("finished-42")
    });
    for (what, _) in &attempts {
        let pwned = evidence.join(format!("pwned-{what}"));
        assert!(
            !pwned.exists(),
            "a command typed into the person's shell through {what}; screen:\n{}",
            screen.lock().unwrap()
        );
    }
    let screen_text = screen.lock().unwrap()[control_screen..].to_owned();
    assert!(!screen_text.contains("injected"), "{screen_text}");
    // The other terminal: nothing drawn on it, and the typed line is still unread.
    assert!(
        !other_screen.lock().unwrap().contains("Password"),
        "{}",
        other_screen.lock().unwrap()
    );
    let mut unread = [0u8; 100];
    // SAFETY: fcntl and read on a descriptor we own, into a buffer of the given length.
    let n = unsafe {
        libc::fcntl(other_slave.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
        libc::read(
            other_slave.as_raw_fd(),
            unread.as_mut_ptr().cast(),
            unread.len(),
        )
    };
    let n = usize::try_from(n).unwrap_or(0);
    assert_eq!(text(&unread[..n]), "typed-in-the-other-terminal\n");

    type_into(&master, "exit\n");
    let deadline = Instant::now() + WAIT;
    while shell.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = shell.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = shell.wait();
}

/// Live children of `pid` (from /proc).
fn children_of(pid: u32) -> Vec<i32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        if state != "Z" && fields.next() == Some(pid.to_string().as_str()) {
            children.push(entry.file_name().to_str().unwrap().parse().unwrap());
        }
    }
    children
}

impl UserLaptop {
    /// Whether the device is still online (for an executor this struct did not spawn).
    fn executor_alive_by_device(&self) -> bool {
        self.device_id().is_some()
    }
}

// ----- a root launcher -----

/// A root executor is not bound by `RLIMIT_NPROC`, so without a delegated cgroup only the
/// launcher can stop a fork-hopping chain: it puts the command in its own PID namespace, which
/// the kernel empties when the shell (its first process) is killed.
#[tokio::test]
async fn a_root_launchers_fork_hopping_chain_is_gone_a_second_after_its_timeout() {
    assert!(nix::unistd::geteuid().is_root(), "this test runs as root");
    let f = Folder::new();
    let name = hopper_name();
    build_hopper(&f.project, &name);
    let mut request = f.request(&hopping_chain(&name), CommandLimits::default(), &[]);
    request.timeout = Some(Duration::from_secs(2));
    let out = sandboxed(request).await;
    let result_at = Instant::now();
    assert!(out.timed_out, "{out:?}");
    assert_chain_gone_a_second_after(&name, result_at);
}

/// A root executor's commands run with no capability at all (none effective, permitted,
/// inheritable, ambient or in the bounding set, and root regains none by exec): Landlock
/// confines paths, not what `CAP_SYS_ADMIN`, `CAP_BPF` or `CAP_SYS_MODULE` reach. Here: root's
/// `CAP_DAC_OVERRIDE` would read another user's private file in the shared folder.
#[tokio::test]
async fn a_root_launchers_command_has_no_capabilities() {
    assert!(nix::unistd::geteuid().is_root(), "this test runs as root");
    let f = Folder::new();
    let private = f.project.join("nobodys.txt");
    std::fs::write(&private, "nobody's-private-fixture").unwrap();
    std::os::unix::fs::chown(&private, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // Control: root outside the sandbox reads it (CAP_DAC_OVERRIDE).
    let control = Command::new("cat").arg(&private).output().unwrap();
    assert!(
        text(&control.stdout).contains("nobody's-private"),
        "{control:?}"
    );

    let out = sandboxed(f.request(
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; cat nobodys.txt",
        CommandLimits::default(),
        &[],
    ))
    .await;
    assert!(!out.stdout.contains("nobody's-private"), "{out:?}");
    let caps: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("Cap"))
        .collect();
    assert_eq!(caps.len(), 5, "{out:?}");
    for line in caps {
        assert!(line.ends_with("0000000000000000"), "{line}: {out:?}");
    }
}
