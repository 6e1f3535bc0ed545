//! The server → laptop path with every part real: agentd, workspaced and gatewayd on a temp state
//! root ([`Stack::start_with_gateway`]), a laptop (`agentworks login --with-token`, then
//! `agentworks executor connect` as a child process with its own HOME and XDG dirs), and
//! dispatches through `gatewayd.sock` with server-made request ids, as agentd makes them.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use sha2::Digest;

use super::harness::{Client, ExecutorProcess, Gatewayd, Laptop, Person, Stack, processes_with};

/// How long a bounded wait for something that must happen may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);
/// The SSH key fixture's content: never to be seen by a command.
const SSH_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY----- sshkey-fixture-b64 -----END";
/// The blocked file's content.
const BLOCKED: &str = "blocked-content-7f3a";
/// The executor's secret environment variable.
const GITHUB_TOKEN: &str = "secret123";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique string (request ids, markers).
fn unique(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// A laptop ([`Laptop::new`]): a private HOME (with an SSH key), XDG config and state dirs
/// outside it, and three project folders under `~/src`: `proj` (shared writable, with a blocked
/// `private/`), `docs` (shared read-only) and `repo` (shared writable, no exclusions).
fn standard_laptop() -> Laptop {
    Laptop::new(
        "aw-laptop-",
        &[
            (".ssh/id_ed25519", SSH_KEY),
            ("src/proj/readme.txt", "readme\n"),
            ("src/proj/private/key.txt", BLOCKED),
            ("src/docs/doc.txt", "doc\n"),
            ("src/repo/a.txt", "one\ntwo\nthree\n"),
            ("src/repo/b.txt", "alpha\nbeta\n"),
        ],
    )
}

/// What these tests do with the laptop of [`standard_laptop`].
trait LaptopExt {
    /// A file in a project folder.
    fn read(&self, folder: &str, file: &str) -> String;
    /// The standard grants: `--write-folder proj --block proj/private --folder docs
    /// --write-folder repo`.
    fn grants(&self) -> Vec<String>;
    /// `agentworks executor connect --name laptop <grants>`, with [`GITHUB_TOKEN`] and `env` in
    /// its environment.
    fn share(&self, grants: &[String], env: &[(&str, &str)]) -> ExecutorProcess;
}

impl LaptopExt for Laptop {
    fn read(&self, folder: &str, file: &str) -> String {
        std::fs::read_to_string(self.folder(folder).join(file)).unwrap()
    }
    fn grants(&self) -> Vec<String> {
        let path = |p: PathBuf| p.to_str().unwrap().to_owned();
        vec![
            "--write-folder".into(),
            path(self.folder("proj")),
            "--block".into(),
            path(self.folder("proj/private")),
            "--folder".into(),
            path(self.folder("docs")),
            "--write-folder".into(),
            path(self.folder("repo")),
        ]
    }
    fn share(&self, grants: &[String], env: &[(&str, &str)]) -> ExecutorProcess {
        let mut args = vec!["--name", "laptop"];
        args.extend(grants.iter().map(String::as_str));
        let mut all_env = vec![("GITHUB_TOKEN", GITHUB_TOKEN)];
        all_env.extend(env.iter().copied());
        self.executor_connect(&args, &all_env)
    }
}

/// Everything real, alice logged in on a laptop that shares the standard grants. Fields drop
/// in order: the executor first, then gatewayd, then agentd and workspaced.
struct Setup {
    executor: Option<ExecutorProcess>,
    gw: Gatewayd,
    stack: Stack,
    gw_port: u16,
    alice: Person,
    laptop: Laptop,
    device_id: String,
}

impl Setup {
    fn start(env: &[(&str, &str)]) -> Setup {
        let laptop = standard_laptop();
        let grants = laptop.grants();
        Setup::start_on(laptop, &grants, env)
    }

    /// Everything real, alice logged in on `laptop`, which shares `grants`; returns once the
    /// device is online.
    fn start_on(laptop: Laptop, grants: &[String], env: &[(&str, &str)]) -> Setup {
        let (stack, gw_port) = Stack::start_with_gateway();
        let gw = Gatewayd::start(&stack, gw_port);
        let alice = stack.person("alice");
        laptop.login(&stack, gw_port, &alice.token);
        let mut setup = Setup {
            executor: None,
            gw,
            stack,
            gw_port,
            alice,
            laptop,
            device_id: String::new(),
        };
        setup.executor = Some(setup.laptop.share(grants, env));
        setup.device_id = setup.wait_online()["device_id"]
            .as_str()
            .unwrap()
            .to_owned();
        setup
    }

    fn client(&self) -> Client {
        self.gw.client()
    }

    fn executor(&mut self) -> &mut ExecutorProcess {
        self.executor.as_mut().unwrap()
    }

    fn devices(&self, user_id: &str) -> Vec<Value> {
        self.client()
            .json("/v1/devices", json!({"user_id": user_id}))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// Waits until alice's device is listed online; returns it.
    fn wait_online(&self) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(device) = self
                .devices(&self.alice.user_id)
                .into_iter()
                .find(|d| d["online"] == true)
            {
                return device;
            }
            if let Some(executor) = &self.executor {
                assert!(
                    Instant::now() < deadline,
                    "the device did not come online; executor stderr:\n{}",
                    executor.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until alice has no online device.
    fn wait_offline(&self) {
        let deadline = Instant::now() + WAIT;
        while self
            .devices(&self.alice.user_id)
            .iter()
            .any(|d| d["online"] == true)
        {
            assert!(Instant::now() < deadline, "the device stayed online");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn body(&self, folder: &str, request_id: &str, operation: Value) -> Value {
        json!({"user_id": self.alice.user_id, "device_id": self.device_id, "folder": folder,
               "request_id": request_id, "operation": operation})
    }

    /// One dispatch through gatewayd.sock, as alice.
    fn dispatch(
        &self,
        folder: &str,
        request_id: &str,
        operation: Value,
    ) -> Result<Value, (String, Value)> {
        self.client()
            .json("/v1/dispatch", self.body(folder, request_id, operation))
    }

    /// A dispatch that must end `done`; returns its outcome.
    fn done(&self, folder: &str, operation: Value) -> Value {
        let answer = self
            .dispatch(folder, &unique("req"), operation.clone())
            .unwrap_or_else(|e| panic!("{operation}: {e:?}"));
        assert_eq!(answer["state"], "done", "{operation}: {answer}");
        answer["outcome"].clone()
    }

    /// A shell command that must complete; returns its outcome.
    fn run(&self, folder: &str, command: &str) -> Value {
        let outcome = self.done(folder, shell(command, None));
        assert_eq!(outcome["status"], "completed", "{command}: {outcome}");
        outcome
    }

    /// A dispatch on its own thread; its answer arrives on the receiver.
    fn dispatch_in_background(
        &self,
        folder: &str,
        request_id: &str,
        operation: Value,
    ) -> mpsc::Receiver<Result<Value, (String, Value)>> {
        let (tx, rx) = mpsc::channel();
        let client = self.client();
        let body = self.body(folder, request_id, operation);
        std::thread::spawn(move || {
            let _ = tx.send(client.json("/v1/dispatch", body));
        });
        rx
    }
}

fn shell(command: &str, timeout: Option<u64>) -> Value {
    json!({"kind": "execute_shell_command", "command": command, "timeout": timeout})
}

fn patch(filepath: &str, diff: &str) -> Value {
    json!({"kind": "diff_patch_workspace_file", "filepath": filepath, "diff": diff})
}

fn exit_code(outcome: &Value) -> i64 {
    outcome["exit_code"].as_i64().unwrap_or(-1)
}

fn stdout(outcome: &Value) -> &str {
    outcome["stdout"].as_str().unwrap()
}

/// A command that must fail (non-zero exit).
fn assert_fails(setup: &Setup, folder: &str, command: &str) {
    let outcome = setup.run(folder, command);
    assert_ne!(exit_code(&outcome), 0, "{command} succeeded: {outcome}");
}

/// A command that must fail (non-zero exit) without printing `secret`.
fn assert_denied(setup: &Setup, folder: &str, command: &str, secret: &str) {
    let outcome = setup.run(folder, command);
    assert_ne!(exit_code(&outcome), 0, "{command} succeeded: {outcome}");
    assert!(
        !outcome.to_string().contains(secret),
        "{command} revealed {secret}: {outcome}"
    );
}

/// Waits until some process carries `marker` (the command is running).
fn wait_running(marker: &str) {
    let deadline = Instant::now() + WAIT;
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether every process carrying `marker` is gone within [`WAIT`].
fn gone(marker: &str) -> Result<(), Vec<String>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn answer(rx: &mpsc::Receiver<Result<Value, (String, Value)>>) -> Value {
    rx.recv_timeout(WAIT)
        .expect("the pending dispatch did not return")
        .expect("the dispatch failed")
}

fn revision(content: &str) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(content)))
}

// ----- 1. devices -----

#[test]
fn the_device_is_listed_online_to_its_owner_only() {
    let setup = Setup::start(&[]);
    let devices = setup.devices(&setup.alice.user_id);
    assert_eq!(devices.len(), 1, "{devices:?}");
    let device = &devices[0];
    assert_eq!(device["online"], true);
    assert_eq!(device["name"], "laptop");
    assert_eq!(device["user_id"], setup.alice.user_id.as_str());
    let mut folders = device["folders"].as_array().unwrap().clone();
    folders.sort_by_key(|f| f["alias"].as_str().unwrap().to_owned());
    assert_eq!(
        Value::Array(folders),
        json!([
            {"alias": "docs", "access": "read_only", "downloads": false},
            {"alias": "proj", "access": "read_write", "downloads": false},
            {"alias": "repo", "access": "read_write", "downloads": false},
        ])
    );
    // No absolute path ever reaches the server.
    let home = setup.laptop.home();
    assert!(
        !device.to_string().contains(home.to_str().unwrap()),
        "{device}"
    );

    // Alice can use it.
    let outcome = setup.run("repo", "echo hi");
    assert_eq!(stdout(&outcome), "hi\n");

    // Bob, with his own devices:connect token, sees nothing and reaches nothing.
    let bob = setup.stack.person("bob");
    assert_ne!(bob.user_id, setup.alice.user_id);
    assert!(setup.devices(&bob.user_id).is_empty());
    let marker = setup.laptop.folder("repo").join("bob-was-here");
    let mut body = setup.body(
        "repo",
        &unique("bob"),
        shell(&format!("touch {}", marker.display()), None),
    );
    body["user_id"] = json!(bob.user_id);
    let (code, details) = setup.client().json("/v1/dispatch", body).unwrap_err();
    assert_eq!(code, "not_found", "{details}");
    assert!(!marker.exists());
}

// ----- 2. shell commands -----

#[test]
fn shell_commands_round_trip_and_stay_confined() {
    let setup = Setup::start(&[]);
    let laptop = &setup.laptop;

    // Round trip.
    let outcome = setup.run("proj", "echo hello; echo oops >&2; exit 3");
    assert_eq!(stdout(&outcome), "hello\n");
    assert_eq!(outcome["stderr"], "oops\n");
    assert_eq!(outcome["exit_code"], 3);
    assert_eq!(outcome["timed_out"], false);
    assert_eq!(outcome["stdout_truncated"], false);
    // Commands start in their folder and can read it.
    assert_eq!(stdout(&setup.run("proj", "cat readme.txt")), "readme\n");

    // An outside file: the SSH key (which the test itself can read).
    let key = laptop.home().join(".ssh/id_ed25519");
    assert_eq!(std::fs::read_to_string(&key).unwrap(), SSH_KEY);
    assert_denied(
        &setup,
        "proj",
        "cat \"$HOME/.ssh/id_ed25519\"",
        "sshkey-fixture",
    );
    assert_denied(
        &setup,
        "repo",
        &format!("cat {}", key.display()),
        "sshkey-fixture",
    );

    // The read-only folder: readable, not writable.
    assert_eq!(stdout(&setup.run("docs", "cat doc.txt")), "doc\n");
    assert_fails(&setup, "docs", "echo changed > doc.txt");
    assert_fails(&setup, "docs", "touch new.txt");
    assert_fails(&setup, "docs", "rm doc.txt");
    // ... nor from a command of another (writable) folder.
    let doc = laptop.folder("docs").join("doc.txt");
    assert_fails(&setup, "repo", &format!("echo x > {}", doc.display()));
    assert_eq!(laptop.read("docs", "doc.txt"), "doc\n");
    assert!(!laptop.folder("docs").join("new.txt").exists());

    // The --block path: neither readable nor writable, nor can anything be made in it.
    assert_denied(&setup, "proj", "cat private/key.txt", BLOCKED);
    assert_fails(&setup, "proj", "echo x > private/key.txt");
    assert_fails(&setup, "proj", "touch private/new.txt");
    assert_fails(&setup, "proj", "rm private/key.txt");
    assert_eq!(laptop.read("proj", "private/key.txt"), BLOCKED);
    assert!(!laptop.folder("proj").join("private/new.txt").exists());

    // The CLI's credential and state dirs (they exist: the executor uses them).
    let credentials = laptop.credentials();
    let token = setup.alice.token.as_str();
    assert!(
        std::fs::read_to_string(&credentials)
            .unwrap()
            .contains(token)
    );
    let state = laptop.state_home().join("agentworks");
    assert!(state.join("receipts.db").exists());
    assert_denied(
        &setup,
        "repo",
        &format!("cat {}", credentials.display()),
        token,
    );
    assert_denied(
        &setup,
        "repo",
        &format!("ls {}", credentials.parent().unwrap().display()),
        "credentials.json",
    );
    assert_denied(
        &setup,
        "repo",
        &format!("ls {}", state.display()),
        "receipts",
    );
    assert_denied(
        &setup,
        "repo",
        &format!("cat {}/receipts.db", state.display()),
        "CREATE TABLE",
    );
    assert_fails(
        &setup,
        "repo",
        &format!("touch {}/planted", state.display()),
    );
    assert!(!state.join("planted").exists());

    // A writable folder supports git.
    let git = "git -c user.email=a@b -c user.name=a";
    let outcome = setup.run(
        "repo",
        &format!(
            "{git} init -q && {git} add a.txt && {git} commit -q -m init && {git} log --oneline"
        ),
    );
    assert_eq!(exit_code(&outcome), 0, "{outcome}");
    assert!(stdout(&outcome).contains("init"), "{outcome}");
    assert!(laptop.folder("repo").join(".git/HEAD").exists());

    // Network to a loopback server.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.write_all(b"pong-from-loopback\n").unwrap();
    });
    let outcome = setup.run(
        "repo",
        &format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}; cat <&3'"),
    );
    assert_eq!(stdout(&outcome), "pong-from-loopback\n", "{outcome}");
    server.join().unwrap();

    // The executor's secret environment is not the command's, nor readable through /proc.
    let outcome = setup.run("repo", "echo \"[$GITHUB_TOKEN]\"; env");
    assert!(stdout(&outcome).starts_with("[]\n"), "{outcome}");
    assert!(!outcome.to_string().contains(GITHUB_TOKEN), "{outcome}");
    // Nor through /proc: neither the executor's environment (it was given the secret) nor the
    // launcher's.
    let executor_pid = setup.executor.as_ref().unwrap().pid();
    let outcome = setup.run(
        "repo",
        &format!("cat /proc/{executor_pid}/environ; cat /proc/$PPID/environ"),
    );
    assert!(!outcome.to_string().contains(GITHUB_TOKEN), "{outcome}");

    // 2 MiB of output: 1 MiB comes back, marked truncated.
    let outcome = setup.run("repo", "head -c 2097152 /dev/zero | tr '\\0' a");
    let out = stdout(&outcome);
    assert_eq!(out.len(), 1024 * 1024);
    assert!(out.bytes().all(|b| b == b'a'));
    assert_eq!(outcome["stdout_truncated"], true);
    assert_eq!(outcome["exit_code"], 0);

    // no_new_privs.
    let outcome = setup.run("repo", "grep NoNewPrivs /proc/self/status");
    assert!(
        stdout(&outcome).split_whitespace().collect::<Vec<_>>() == ["NoNewPrivs:", "1"],
        "{outcome}"
    );

    // A symlink in a writable folder pointing outside gives no access: one placed there by
    // someone else, and one the command makes itself.
    std::os::unix::fs::symlink(
        laptop.home().join(".ssh"),
        laptop.folder("repo").join("out"),
    )
    .unwrap();
    assert_denied(&setup, "repo", "cat out/id_ed25519", "sshkey-fixture");
    assert_fails(&setup, "repo", "echo x > out/planted");
    assert!(!laptop.home().join(".ssh/planted").exists());
    assert_denied(
        &setup,
        "repo",
        "ln -s \"$HOME/.ssh/id_ed25519\" leak && cat leak",
        "sshkey-fixture",
    );

    // A hardlink to an outside file cannot be made.
    assert_fails(&setup, "repo", "ln \"$HOME/.ssh/id_ed25519\" hard");
    assert!(!laptop.folder("repo").join("hard").exists());
    assert_eq!(std::fs::read_to_string(&key).unwrap(), SSH_KEY);
}

// ----- 3. patches -----

#[test]
fn patches_change_files_and_report_their_revisions_or_change_nothing() {
    let setup = Setup::start(&[]);
    let laptop = &setup.laptop;

    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";
    let outcome = setup.done("repo", patch("a.txt", diff));
    let expected = "one\nTWO\nthree\n";
    assert_eq!(
        outcome,
        json!({"status": "patched", "files": [{"path": "a.txt", "revision": revision(expected)}]})
    );
    assert_eq!(laptop.read("repo", "a.txt"), expected);

    // Two files, the second hunk does not match: nothing changes.
    let multi = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-TWO\n+2\n three\n\
                 --- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n alpha\n-gamma\n+delta\n";
    let outcome = setup.done("repo", patch("a.txt", multi));
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(outcome["code"], "patch_mismatch", "{outcome}");
    assert_eq!(laptop.read("repo", "a.txt"), expected);
    assert_eq!(laptop.read("repo", "b.txt"), "alpha\nbeta\n");

    // A folder with a blocked path inside still takes patches on its other files ...
    let diff = "--- a/readme.txt\n+++ b/readme.txt\n@@ -1 +1 @@\n-readme\n+README\n";
    let outcome = setup.done("proj", patch("readme.txt", diff));
    assert_eq!(
        outcome,
        json!({"status": "patched", "files": [{"path": "readme.txt", "revision": revision("README\n")}]})
    );
    assert_eq!(laptop.read("proj", "readme.txt"), "README\n");
    // ... never on the blocked one, and never on a read-only folder.
    let diff =
        format!("--- a/private/key.txt\n+++ b/private/key.txt\n@@ -1 +1 @@\n-{BLOCKED}\n+x\n");
    let outcome = setup.done("proj", patch("private/key.txt", &diff));
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(laptop.read("proj", "private/key.txt"), BLOCKED);
    let diff = "--- a/doc.txt\n+++ b/doc.txt\n@@ -1 +1 @@\n-doc\n+DOC\n";
    let outcome = setup.done("docs", patch("doc.txt", diff));
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(laptop.read("docs", "doc.txt"), "doc\n");
}

// ----- 4. timeouts -----

#[test]
fn a_timed_out_command_leaves_no_process_behind() {
    let setup = Setup::start(&[]);
    let marker = unique("grandchild");
    let command =
        format!("setsid sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 & echo started; sleep 300");
    let outcome = setup.done("repo", shell(&command, Some(1)));
    assert_eq!(outcome["status"], "completed", "{outcome}");
    assert_eq!(outcome["timed_out"], true, "{outcome}");
    assert_eq!(stdout(&outcome), "started\n");
    gone(&marker).unwrap_or_else(|left| panic!("left behind: {left:?}"));
}

// ----- 5. the executor dies -----

#[test]
fn a_killed_executor_fails_the_request_kills_the_command_and_never_reruns_it() {
    let mut setup = Setup::start(&[]);
    let marker = unique("killed");
    let request_id = unique("req-kill");
    let count = setup.laptop.folder("repo").join("count.txt");
    let operation = shell(
        &format!("echo ran >> count.txt; sleep 120; : {marker}"),
        Some(200),
    );
    let rx = setup.dispatch_in_background("repo", &request_id, operation.clone());
    wait_running(&marker);
    let deadline = Instant::now() + WAIT;
    while std::fs::read_to_string(&count).unwrap_or_default() != "ran\n" {
        assert!(Instant::now() < deadline, "the command did not run");
        std::thread::sleep(Duration::from_millis(10));
    }

    setup.executor().signal(Signal::SIGKILL);
    let answer = answer(&rx);
    // Unknown because the connection ended, not because the 200 s deadline passed.
    assert_eq!(answer["state"], "unknown", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("disconnected"),
        "{answer}"
    );
    gone(&marker).unwrap_or_else(|left| panic!("the command survived its executor: {left:?}"));

    // The executor restarts and reconnects; the same request id is answered from gatewayd's
    // record and never sent again.
    setup.executor = None;
    setup.wait_offline();
    setup.executor = Some(setup.laptop.share(&setup.laptop.grants(), &[]));
    let device = setup.wait_online();
    assert_eq!(device["device_id"], setup.device_id.as_str());
    let again = setup
        .dispatch("repo", &request_id, operation.clone())
        .unwrap();
    assert_eq!(again, answer);
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n");

    // Were it sent again (gatewayd's record lost), the executor's own receipts refuse to run
    // it: the request was interrupted, its outcome unknown.
    setup.gw.stop();
    match &setup.stack.cluster {
        Some((postgres, _)) => {
            postgres.psql("agentworks", "DELETE FROM gateway_requests");
        }
        None => {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(
                    setup
                        .stack
                        .state
                        .root()
                        .join(format!("gateway/gatewayd.db{suffix}")),
                );
            }
        }
    }
    setup.gw = Gatewayd::start(&setup.stack, setup.gw_port);
    setup.device_id = setup.wait_online()["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resent = setup.dispatch("repo", &request_id, operation).unwrap();
    assert_eq!(resent["state"], "done", "{resent}");
    assert_eq!(resent["outcome"]["status"], "interrupted", "{resent}");
    assert_eq!(std::fs::read_to_string(&count).unwrap(), "ran\n");
    assert!(processes_with(&marker).is_empty());
}

// ----- 6. Ctrl-C -----

#[test]
fn ctrl_c_kills_the_running_command_and_fails_the_request() {
    let mut setup = Setup::start(&[]);
    let marker = unique("ctrlc");
    let rx = setup.dispatch_in_background(
        "repo",
        &unique("req-int"),
        shell(&format!("sleep 120; : {marker}"), Some(200)),
    );
    wait_running(&marker);
    setup.executor().signal(Signal::SIGINT);
    let answer = answer(&rx);
    let cancelled = answer["state"] == "done" && answer["outcome"]["cancelled"] == true;
    assert!(answer["state"] == "unknown" || cancelled, "{answer}");
    gone(&marker).unwrap_or_else(|left| panic!("the command survived Ctrl-C: {left:?}"));
    let status = setup
        .executor()
        .wait_exit(WAIT)
        .expect("the executor did not exit");
    assert_eq!(status.code(), Some(0), "{}", setup.executor().stderr());
    setup.wait_offline();
}

// ----- 7. revocation -----

#[test]
fn revoking_the_token_disconnects_the_executor_at_once_and_stops_its_command() {
    let mut setup = Setup::start(&[]);
    let marker = unique("revoked");
    let rx = setup.dispatch_in_background(
        "repo",
        &unique("req-rev"),
        shell(&format!("sleep 120; : {marker}"), Some(200)),
    );
    wait_running(&marker);

    let out = setup.stack.ctl(&["token", "revoke", &setup.alice.token_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // gatewayd checks its connections' tokens every second; the rest is the close frame and
    // the executor stopping its command. 5 s leaves room for a loaded machine: without the
    // revocation feed, only the 30 s heartbeats would end the connection.
    let revoked = Instant::now();
    let status = setup.executor().wait_exit(Duration::from_secs(5));
    let took = revoked.elapsed();
    let stderr = setup.executor().stderr();
    let status = status.unwrap_or_else(|| panic!("still running after {took:?}: {stderr}"));
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("revoked"), "{stderr}");
    assert!(stderr.contains("agentworks login"), "{stderr}");

    let answer = answer(&rx);
    assert_eq!(answer["state"], "unknown", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("revoked"),
        "{answer}"
    );
    gone(&marker).unwrap_or_else(|left| panic!("the command survived revocation: {left:?}"));

    // It cannot come back with that credential.
    setup.executor = Some(setup.laptop.share(&setup.laptop.grants(), &[]));
    let status = setup.executor().wait_exit(WAIT).expect("it kept retrying");
    assert_eq!(status.code(), Some(3), "{}", setup.executor().stderr());
    assert!(setup.devices(&setup.alice.user_id)[0]["online"] == false);
}

// ----- 8. refused grants -----

#[test]
fn connect_refuses_the_home_and_credential_folders_and_never_connects() {
    let (stack, gw_port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, gw_port);
    let alice = stack.person("alice");
    let laptop = standard_laptop();
    laptop.login(&stack, gw_port, &alice.token);
    let path = |p: PathBuf| p.to_str().unwrap().to_owned();
    let cases = [
        (
            vec!["--folder".to_owned(), path(laptop.home())],
            "home directory",
        ),
        (
            vec!["--write-folder".to_owned(), path(laptop.config_home())],
            "credentials",
        ),
        (
            vec![
                "--write-folder".to_owned(),
                path(laptop.config_home().join("agentworks")),
            ],
            "credentials",
        ),
        (
            vec![
                "--folder".to_owned(),
                path(laptop.folder("repo")),
                "--write-folder".to_owned(),
                path(laptop.state_home()),
            ],
            "state",
        ),
    ];
    for (grants, expect) in cases {
        let mut executor = laptop.share(&grants, &[]);
        let status = executor
            .wait_exit(WAIT)
            .unwrap_or_else(|| panic!("{grants:?} was accepted: {}", executor.stderr()));
        let stderr = executor.stderr();
        assert!(!status.success(), "{grants:?}: {stderr}");
        assert!(stderr.contains("refusing"), "{grants:?}: {stderr}");
        assert!(stderr.contains(expect), "{grants:?}: {stderr}");
    }
    let devices = gw
        .client()
        .json("/v1/devices", json!({"user_id": alice.user_id}))
        .unwrap();
    assert_eq!(devices, json!([]));
    // The same laptop with a proper folder does connect (the refusals were the grants').
    let _executor = laptop.share(&laptop.grants(), &[]);
    let deadline = Instant::now() + WAIT;
    while gw
        .client()
        .json("/v1/devices", json!({"user_id": alice.user_id}))
        .unwrap()
        == json!([])
    {
        assert!(
            Instant::now() < deadline,
            "a valid executor did not connect"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ----- folder aliases: the contract's rule, applied by the laptop before it dials -----

#[test]
fn a_folder_named_my_notes_is_shared_and_used_end_to_end() {
    let laptop = Laptop::new("aw-laptop-", &[("src/My Notes/todo.txt", "milk\n")]);
    let grants = vec![
        "--write-folder".to_owned(),
        laptop.folder("My Notes").to_str().unwrap().to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    let device = setup.wait_online();
    assert_eq!(device["folders"][0]["alias"], "My Notes", "{device}");
    let outcome = setup.run("My Notes", "cat todo.txt && echo eggs >> todo.txt");
    assert_eq!(stdout(&outcome), "milk\n", "{outcome}");
    let diff = "--- a/todo.txt\n+++ b/todo.txt\n@@ -1,2 +1,2 @@\n milk\n-eggs\n+bread\n";
    let outcome = setup.done("My Notes", patch("todo.txt", diff));
    assert_eq!(outcome["status"], "patched", "{outcome}");
    assert_eq!(setup.laptop.read("My Notes", "todo.txt"), "milk\nbread\n");
}

#[test]
fn a_folder_name_the_contract_refuses_is_refused_before_dialing_with_the_reason() {
    let (stack, gw_port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, gw_port);
    let alice = stack.person("alice");
    let laptop = Laptop::new(
        "aw-laptop-",
        &[
            ("src/notes: 2026/a.txt", "a\n"),
            ("src/tab\there/a.txt", "a\n"),
        ],
    );
    laptop.login(&stack, gw_port, &alice.token);
    for (name, reason) in [("notes: 2026", "':'"), ("tab\there", "'\\t'")] {
        let grants = [
            "--folder".to_owned(),
            laptop.folder(name).to_str().unwrap().to_owned(),
        ];
        let mut executor = laptop.share(&grants, &[]);
        let status = executor
            .wait_exit(WAIT)
            .unwrap_or_else(|| panic!("{name:?} was accepted: {}", executor.stderr()));
        let stderr = executor.stderr();
        assert!(!status.success(), "{name:?}: {stderr}");
        assert!(
            stderr.contains(reason) && stderr.contains("rename the folder"),
            "{name:?}: {stderr}"
        );
        assert!(
            !stderr.contains("connecting to"),
            "{name:?} dialed: {stderr}"
        );
    }
    let devices = gw
        .client()
        .json("/v1/devices", json!({"user_id": alice.user_id}))
        .unwrap();
    assert_eq!(devices, json!([]));
}

// ----- 9. no Landlock -----

#[test]
fn without_landlock_every_command_and_patch_is_refused() {
    let setup = Setup::start(&[("AGENTWORKS_TEST_LANDLOCK_ABI", "0")]);
    let marker = setup.laptop.folder("repo").join("ran-unsandboxed");
    let outcome = setup.done("repo", shell(&format!("touch {}", marker.display()), None));
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(outcome["code"], "sandbox_unavailable", "{outcome}");
    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";
    let outcome = setup.done("repo", patch("a.txt", diff));
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(setup.laptop.read("repo", "a.txt"), "one\ntwo\nthree\n");
    assert!(!marker.exists());
    let stderr = setup.executor.as_ref().unwrap().stderr();
    assert!(stderr.contains("refused"), "{stderr}");
}

/// `--downloads` shares ~/Downloads read/write beside the folders, as `$AGENTWORKS_DOWNLOADS`,
/// and never widens a read-only project nested inside it.
#[test]
fn downloads_is_a_writable_companion_that_never_widens_a_nested_read_only_project() {
    let laptop = standard_laptop();
    let downloads = laptop.home().join("Downloads");
    let nested = downloads.join("ro-project");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(nested.join("spec.txt"), "spec\n").unwrap();
    // With a project nested in Downloads, new entries directly in ~/Downloads itself cannot be
    // created (the documented Landlock limit: a folder on the path to an exclusion); its
    // other folders are fully writable.
    std::fs::create_dir_all(downloads.join("inbox")).unwrap();
    let grants = vec![
        "--folder".to_owned(),
        nested.to_str().unwrap().to_owned(),
        "--downloads".to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    let device = setup.wait_online();
    assert_eq!(
        device["folders"],
        json!([{"alias": "ro-project", "access": "read_only", "downloads": true}])
    );

    // The companion is writable, through $AGENTWORKS_DOWNLOADS.
    let wrote = setup.run(
        "ro-project",
        "echo saved > \"$AGENTWORKS_DOWNLOADS/inbox/report.txt\" && cat spec.txt",
    );
    assert_eq!(wrote["exit_code"], 0, "{wrote}");
    assert_eq!(wrote["stdout"], "spec\n");
    assert_eq!(
        std::fs::read_to_string(downloads.join("inbox/report.txt")).unwrap(),
        "saved\n"
    );
    // The read-only project inside it stays read-only, by either path.
    for target in ["spec.txt", "\"$AGENTWORKS_DOWNLOADS/ro-project/spec.txt\""] {
        let refused = setup.run("ro-project", &format!("echo changed > {target}"));
        assert_ne!(refused["exit_code"], 0, "{target}: {refused}");
    }
    let created = setup.run(
        "ro-project",
        "echo new > \"$AGENTWORKS_DOWNLOADS/ro-project/new.txt\"",
    );
    assert_ne!(created["exit_code"], 0, "{created}");
    assert_eq!(
        std::fs::read_to_string(nested.join("spec.txt")).unwrap(),
        "spec\n"
    );
    assert!(!nested.join("new.txt").exists());
}

// ----- pinned folders (issue 10, items 3 and 7) -----

/// A laptop with a Go workspace, a cargo toolchain (with a credential) and Downloads, beside the
/// standard folders.
fn toolchain_laptop() -> Laptop {
    let laptop = Laptop::new(
        "aw-laptop-pin-",
        &[
            (".ssh/id_ed25519", SSH_KEY),
            ("go/bin/gotool", "#!/bin/sh\necho gotool-ran\n"),
            ("go/src/main.go", "package main\n"),
            (".cargo/bin/cargotool", "#!/bin/sh\necho cargotool-ran\n"),
            (".cargo/credentials.toml", "CARGO-TOKEN-FIXTURE-31f0"),
            ("src/repo/a.txt", "one\n"),
            ("Downloads/inbox/r.txt", "report\n"),
            ("Downloads/proj/readme.txt", "readme\n"),
            ("Downloads/ro/spec.txt", "spec\n"),
            ("Downloads/keep/k.txt", "keep\n"),
            ("Downloads/secret.txt", BLOCKED),
        ],
    );
    for tool in ["go/bin/gotool", ".cargo/bin/cargotool"] {
        use std::os::unix::fs::PermissionsExt;
        let path = laptop.home().join(tool);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    laptop
}

fn path_arg(path: PathBuf) -> String {
    path.to_str().unwrap().to_owned()
}

/// The outcome of a request that must be refused before anything ran.
fn refused_with(setup: &Setup, folder: &str, operation: Value, code: &str) -> Value {
    let outcome = setup.done(folder, operation);
    assert_eq!(outcome["status"], "refused", "{outcome}");
    assert_eq!(outcome["code"], code, "{outcome}");
    outcome
}

/// Regression (issue 10, item 3): with `--write-folder ~/go`, a command replaced `~/go/bin` by a
/// symlink to `$HOME`, and the next command read `~/.ssh/id_ed25519`, because toolchain folders
/// were resolved again (following symlinks) for every request. Toolchains are pinned at connect
/// now, and one inside a writable grant is not a toolchain at all.
#[test]
fn a_toolchain_folder_turned_into_a_symlink_to_home_grants_nothing() {
    let laptop = toolchain_laptop();
    let grants = vec![
        "--write-folder".to_owned(),
        path_arg(laptop.home().join("go")),
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    // The pinned toolchain runs, its credential stays unreadable, the key too.
    let ran = setup.run("repo", "\"$HOME/.cargo/bin/cargotool\"");
    assert_eq!(stdout(&ran), "cargotool-ran\n", "{ran}");
    assert_denied(
        &setup,
        "repo",
        "cat \"$HOME/.cargo/credentials.toml\"",
        "CARGO-TOKEN-FIXTURE",
    );
    assert_denied(&setup, "repo", "cat \"$HOME/.ssh/id_ed25519\"", SSH_KEY);

    // The attack: the agent may change ~/go, so it turns ~/go/bin into a way to $HOME.
    let swapped = setup.run("go", "mv bin bin-old && ln -s \"$HOME\" bin && ls -l bin");
    assert_eq!(exit_code(&swapped), 0, "{swapped}");
    assert!(
        std::fs::symlink_metadata(setup.laptop.home().join("go/bin"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    for folder in ["repo", "go"] {
        for command in [
            "cat \"$HOME/go/bin/.ssh/id_ed25519\"",
            "cp \"$HOME/go/bin/.ssh/id_ed25519\" stolen",
            "ls \"$HOME/go/bin/.ssh\"",
        ] {
            assert_denied(&setup, folder, command, SSH_KEY);
        }
    }
    assert!(!setup.laptop.folder("repo").join("stolen").exists());
    assert!(!setup.laptop.home().join("go/stolen").exists());
}

/// Regression (issue 10, items 3 and 7): a shared folder nested in the shared Downloads was
/// replaced by a symlink to `$HOME` by a command of another folder; the next request on it ran
/// with `$HOME` granted read/write. A folder that is no longer the directory pinned at connect
/// is refused now, commands and patches alike, until the person reconnects.
#[test]
fn a_shared_folder_replaced_by_a_symlink_is_refused_until_reconnect() {
    let laptop = toolchain_laptop();
    let grants = vec![
        "--write-folder".to_owned(),
        path_arg(laptop.home().join("Downloads/proj")),
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
        "--downloads".to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    assert_eq!(stdout(&setup.run("proj", "cat readme.txt")), "readme\n");

    let swapped = setup.run(
        "repo",
        "mv \"$AGENTWORKS_DOWNLOADS/proj\" \"$AGENTWORKS_DOWNLOADS/proj-moved\" && \
         ln -s \"$HOME\" \"$AGENTWORKS_DOWNLOADS/proj\"",
    );
    assert_eq!(exit_code(&swapped), 0, "{swapped}");

    let outcome = refused_with(
        &setup,
        "proj",
        shell("cat .ssh/id_ed25519; cat \"$HOME/.ssh/id_ed25519\"", None),
        "folder_replaced",
    );
    assert!(
        outcome["message"]
            .as_str()
            .unwrap()
            .contains("moved or replaced"),
        "{outcome}"
    );
    assert!(!outcome.to_string().contains(SSH_KEY));
    let diff = "--- /dev/null\n+++ b/planted.txt\n@@ -0,0 +1 @@\n+planted\n";
    refused_with(
        &setup,
        "proj",
        patch("planted.txt", diff),
        "folder_replaced",
    );
    assert!(!setup.laptop.home().join("planted.txt").exists());
    // The other folder is unaffected.
    assert_eq!(stdout(&setup.run("repo", "cat a.txt")), "one\n");
}

/// Regression (issue 10, item 7): `~/Downloads` replaced by a symlink (to `$HOME`) after connect
/// was followed, so every command had `$HOME` read/write.
#[test]
fn downloads_replaced_by_a_symlink_is_refused() {
    let laptop = toolchain_laptop();
    let grants = vec![
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
        "--downloads".to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    let downloads = setup.laptop.home().join("Downloads");
    std::fs::rename(&downloads, setup.laptop.home().join("Downloads-old")).unwrap();
    std::os::unix::fs::symlink(setup.laptop.home(), &downloads).unwrap();
    let outcome = refused_with(
        &setup,
        "repo",
        shell("cat \"$AGENTWORKS_DOWNLOADS/.ssh/id_ed25519\"", None),
        "folder_replaced",
    );
    assert!(!outcome.to_string().contains(SSH_KEY));
}

/// Regression (issue 10, item 7): a read-only project nested in the shared Downloads was
/// writable from the commands of any other shared folder (only its own were protected).
#[test]
fn a_read_only_project_in_downloads_stays_read_only_from_every_folder() {
    let laptop = toolchain_laptop();
    let ro = laptop.home().join("Downloads/ro");
    let grants = vec![
        "--folder".to_owned(),
        path_arg(ro.clone()),
        "--downloads".to_owned(),
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
        "--downloads".to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    let read = setup.run("repo", "cat \"$AGENTWORKS_DOWNLOADS/ro/spec.txt\"");
    assert_eq!(stdout(&read), "spec\n", "{read}");
    for command in [
        "echo changed > \"$AGENTWORKS_DOWNLOADS/ro/spec.txt\"",
        "echo more >> \"$AGENTWORKS_DOWNLOADS/ro/spec.txt\"",
        "rm \"$AGENTWORKS_DOWNLOADS/ro/spec.txt\"",
        "touch \"$AGENTWORKS_DOWNLOADS/ro/new.txt\"",
        "mv \"$AGENTWORKS_DOWNLOADS/ro\" \"$AGENTWORKS_DOWNLOADS/ro2\"",
    ] {
        assert_fails(&setup, "repo", command);
    }
    assert_eq!(
        std::fs::read_to_string(ro.join("spec.txt")).unwrap(),
        "spec\n"
    );
    assert!(!ro.join("new.txt").exists());
    // The rest of Downloads stays writable.
    let wrote = setup.run(
        "repo",
        "echo saved > \"$AGENTWORKS_DOWNLOADS/inbox/new.txt\"",
    );
    assert_eq!(exit_code(&wrote), 0, "{wrote}");
}

/// Issue 10, item 7: `--block` and `--read-only` inside Downloads were refused at start; they
/// are accepted and enforced for every folder's commands.
#[test]
fn block_and_read_only_inside_downloads_are_accepted_and_enforced() {
    let laptop = toolchain_laptop();
    let downloads = laptop.home().join("Downloads");
    let grants = vec![
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
        "--downloads".to_owned(),
        "--block".to_owned(),
        path_arg(downloads.join("secret.txt")),
        "--read-only".to_owned(),
        path_arg(downloads.join("keep")),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    assert_denied(
        &setup,
        "repo",
        "cat \"$AGENTWORKS_DOWNLOADS/secret.txt\"",
        BLOCKED,
    );
    assert_fails(
        &setup,
        "repo",
        "echo x > \"$AGENTWORKS_DOWNLOADS/secret.txt\"",
    );
    let kept = setup.run("repo", "cat \"$AGENTWORKS_DOWNLOADS/keep/k.txt\"");
    assert_eq!(stdout(&kept), "keep\n", "{kept}");
    assert_fails(
        &setup,
        "repo",
        "echo x > \"$AGENTWORKS_DOWNLOADS/keep/k.txt\"",
    );
    assert_fails(&setup, "repo", "touch \"$AGENTWORKS_DOWNLOADS/keep/new\"");
    let wrote = setup.run("repo", "echo ok > \"$AGENTWORKS_DOWNLOADS/inbox/ok.txt\"");
    assert_eq!(exit_code(&wrote), 0, "{wrote}");
    assert_eq!(
        std::fs::read_to_string(downloads.join("secret.txt")).unwrap(),
        BLOCKED
    );
    assert_eq!(
        std::fs::read_to_string(downloads.join("keep/k.txt")).unwrap(),
        "keep\n"
    );
}

/// Issue 42, item 7: `--folder A --write-folder B --downloads` granted `~/Downloads` to the
/// commands of both folders. `--downloads` links it to the folder it follows: B's commands and
/// patches reach it (with `$AGENTWORKS_DOWNLOADS`), A's get no Downloads at all, by any path, and
/// the server is told so per folder.
#[test]
fn downloads_is_linked_to_the_folder_it_follows_only() {
    let laptop = toolchain_laptop();
    let downloads = laptop.home().join("Downloads");
    let grants = vec![
        "--folder".to_owned(),
        path_arg(laptop.folder("repo")),
        "--write-folder".to_owned(),
        path_arg(laptop.home().join("go")),
        "--downloads".to_owned(),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);

    // A (repo): no variable, and Downloads unreadable by its real path.
    let env = setup.run("repo", "echo \"[${AGENTWORKS_DOWNLOADS-unset}]\"");
    assert_eq!(stdout(&env), "[unset]\n", "{env}");
    let inbox = path_arg(downloads.join("inbox"));
    assert_denied(&setup, "repo", &format!("cat {inbox}/r.txt"), "report");
    assert_denied(&setup, "repo", &format!("ls {inbox}"), "r.txt");
    let device = setup.wait_online();
    assert_eq!(
        device["folders"],
        json!([
            {"alias": "repo", "access": "read_only", "downloads": false},
            {"alias": "go", "access": "read_write", "downloads": true},
        ])
    );

    // B (go), which --downloads follows: read and write, through $AGENTWORKS_DOWNLOADS.
    let linked = setup.run(
        "go",
        "cat \"$AGENTWORKS_DOWNLOADS/inbox/r.txt\" && echo saved > \"$AGENTWORKS_DOWNLOADS/inbox/b.txt\"",
    );
    assert_eq!(stdout(&linked), "report\n", "{linked}");
    assert_eq!(
        std::fs::read_to_string(downloads.join("inbox/b.txt")).unwrap(),
        "saved\n"
    );
    let from_b = path_arg(downloads.join("inbox/from-b.txt"));
    let diff = format!("--- /dev/null\n+++ {from_b}\n@@ -0,0 +1 @@\n+b\n");
    let patched = setup.done("go", patch(&from_b, &diff));
    assert_eq!(patched["status"], "patched", "{patched}");

    // A read-only folder's commands could not write anyway; a write folder without the link is
    // the real test, so B is shared a second time, under another alias, without --downloads.
    drop(setup);
    let laptop = toolchain_laptop();
    let downloads = laptop.home().join("Downloads");
    let inbox = path_arg(downloads.join("inbox"));
    let grants = vec![
        "--write-folder".to_owned(),
        path_arg(laptop.home().join("go")),
        "--downloads".to_owned(),
        "--write-folder".to_owned(),
        path_arg(laptop.folder("repo")),
    ];
    let setup = Setup::start_on(laptop, &grants, &[]);
    let env = setup.run("repo", "echo \"[${AGENTWORKS_DOWNLOADS-unset}]\"");
    assert_eq!(stdout(&env), "[unset]\n", "{env}");
    assert_denied(&setup, "repo", &format!("cat {inbox}/r.txt"), "report");
    assert_fails(&setup, "repo", &format!("echo x > {inbox}/from-a.txt"));
    let from_a = path_arg(downloads.join("inbox/from-a.txt"));
    let diff = format!("--- /dev/null\n+++ {from_a}\n@@ -0,0 +1 @@\n+a\n");
    refused_with(&setup, "repo", patch(&from_a, &diff), "outside_folder");
    assert!(!downloads.join("inbox/from-a.txt").exists());
    let linked = setup.run("go", "cat \"$AGENTWORKS_DOWNLOADS/inbox/r.txt\"");
    assert_eq!(stdout(&linked), "report\n", "{linked}");
}

/// Regression: the private scratch dir (`$TMPDIR`) lies in the CLI's state dir, which is denied,
/// and was therefore not granted at all: commands could not use their own TMPDIR.
#[test]
fn commands_can_use_their_private_tmpdir() {
    let setup = Setup::start(&[]);
    let outcome = setup.run("repo", "echo scratch > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"");
    assert_eq!(stdout(&outcome), "scratch\n", "{outcome}");
    // It is the request's own: gone after the request.
    let state = setup.laptop.state_home().join("agentworks");
    assert_denied(
        &setup,
        "repo",
        &format!("ls {}", state.display()),
        "receipts",
    );
}
