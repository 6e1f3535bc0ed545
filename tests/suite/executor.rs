//! `agentworks` (the laptop CLI) as a real process: login against a real agentd, the grant
//! refusals of `executor connect`, and the executor protocol end to end against an in-test
//! WebSocket gateway (gatewayd is not built yet) that speaks `gateway::protocol`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentworks_contract::executor::{ExecutorFrame, GatewayFrame, Operation, Outcome};
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use super::harness::{
    Gateway, Laptop, Stack, patch, request, runtime, send, shell, spawn_executor, wait_exit,
};

/// A laptop with default XDG dirs ([`Laptop::with_default_dirs`]): the credential is in
/// `~/.config/agentworks/`, the state in `~/.local/state/agentworks/`.
fn default_dirs_laptop() -> Laptop {
    Laptop::with_default_dirs("aw-exec-laptop-", &[])
}

/// What these tests do with the laptop of [`default_dirs_laptop`].
trait LaptopExt {
    /// Create the project folder `~/src/<name>` with `files` (path, content).
    fn project(&self, name: &str, files: &[(&str, &str)]) -> PathBuf;
}

impl LaptopExt for Laptop {
    fn project(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.folder(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (path, content) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        dir
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn login_with_token_stores_the_credential_private_and_checks_it() {
    let stack = Stack::start();
    stack.admin("users/add", serde_json::json!({"name": "alice"}));
    let server = format!("http://127.0.0.1:{}", stack.port);
    let laptop = default_dirs_laptop();
    let login = |token: &str| {
        let mut child = laptop
            .command(&["login", "--server", &server, "--with-token"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
        child.wait_with_output().unwrap()
    };
    let wrong_scope = stack.token("alice", &["workflows:read"], serde_json::json!({}));
    for bad in ["not-a-token", wrong_scope.as_str()] {
        let out = login(bad);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(!laptop.credentials().exists());
    }
    let token = stack.token("alice", &["devices:connect"], serde_json::json!({}));
    let out = login(&token);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&laptop.credentials()), 0o600);
    assert_eq!(mode(laptop.credentials().parent().unwrap()), 0o700);
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(laptop.credentials()).unwrap()).unwrap();
    assert_eq!(stored["token"], token.as_str());

    let out = laptop.command(&["logout"]).output().unwrap();
    assert!(out.status.success());
    assert!(!laptop.credentials().exists());
    // The token was revoked on the server too, not only forgotten locally.
    let tokens = stack.admin("tokens/list", serde_json::json!({"user": "alice"}));
    let revoked = tokens
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["scopes"] == serde_json::json!(["devices:connect"]))
        .all(|t| !t["revoked_at_ms"].is_null());
    assert!(revoked, "{tokens}");
}

#[test]
fn login_with_the_device_grant_gets_a_devices_connect_token() {
    use std::io::BufRead;
    let stack = Stack::start();
    stack.admin("users/add", serde_json::json!({"name": "alice"}));
    let laptop = default_dirs_laptop();
    let server = format!("http://127.0.0.1:{}", stack.port);
    let mut child = laptop
        .command(&[
            "login",
            "--server",
            &server,
            "--name",
            "test-laptop",
            "--yes",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let code = loop {
        let line = lines.next().expect("login printed no code").unwrap();
        if let Some(code) = line.strip_prefix("Code: ") {
            break code.trim().to_owned();
        }
    };
    let approved = stack.ctl(&["login", "approve", &code, "--user", "alice"]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "login did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert_eq!(mode(&laptop.credentials()), 0o600);
    let tokens = stack.admin("tokens/list", serde_json::json!({"user": "alice"}));
    let tokens = tokens.as_array().unwrap();
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert_eq!(tokens[0]["scopes"], serde_json::json!(["devices:connect"]));
}

/// A loopback TCP port with a listener that must never see a connection.
struct Tripwire(std::net::TcpListener);

impl Tripwire {
    fn new() -> Tripwire {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Tripwire(listener)
    }
    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.0.local_addr().unwrap().port())
    }
    fn untouched(&self) -> bool {
        self.0.accept().is_err()
    }
}

#[test]
fn connect_refuses_home_root_parents_and_private_folders() {
    let laptop = default_dirs_laptop();
    laptop.write_credentials("t");
    let wire = Tripwire::new();
    let home = laptop.home();
    let project = laptop.project("p", &[]);
    let state_inside = project.join("state");
    type Case<'a> = (Vec<String>, Vec<(&'a str, PathBuf)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--folder".into(), home.display().to_string()],
            vec![],
            "home directory",
        ),
        (
            vec!["--write-folder".into(), "/".into()],
            vec![],
            "root of the filesystem",
        ),
        (
            vec![
                "--folder".into(),
                home.parent().unwrap().display().to_string(),
            ],
            vec![],
            "parent of your home",
        ),
        (
            vec![
                "--folder".into(),
                home.join(".config").display().to_string(),
            ],
            vec![],
            "credentials",
        ),
        (
            vec!["--write-folder".into(), project.display().to_string()],
            vec![("XDG_STATE_HOME", state_inside)],
            "state",
        ),
        (
            vec![
                "--folder".into(),
                home.join("missing").display().to_string(),
            ],
            vec![],
            "cannot share",
        ),
        (
            vec![
                "--folder".into(),
                project.display().to_string(),
                "--block".into(),
                home.join("elsewhere").display().to_string(),
            ],
            vec![],
            "does not lie inside",
        ),
    ];
    for (args, env, expect) in cases {
        let mut all = vec!["executor", "connect", "--gateway", &wire.url()]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        all.extend(args.clone());
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = laptop.command(&refs).envs(env).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        // One line, the OS error in it once (a missing folder printed it twice, issue 43).
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        if expect == "cannot share" {
            assert_eq!(
                stderr.matches("No such file or directory").count(),
                1,
                "{stderr}"
            );
        }
    }
    assert!(wire.untouched(), "a refused executor connected");
}

/// A `--gateway` the executor would refuse (plain ws:// to another machine) is refused before
/// anything else: alone, without the permissions banner before it (issue 43).
#[test]
fn connect_refuses_plain_ws_to_a_remote_host_before_the_permissions() {
    let laptop = default_dirs_laptop();
    laptop.write_credentials("t");
    let project = laptop.project("proj", &[]);
    let out = laptop
        .command(&[
            "executor",
            "connect",
            "--write-folder",
            project.to_str().unwrap(),
            "--gateway",
            "ws://gateway.example.com",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ws://gateway.example.com") && stderr.contains("loopback"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(stdout, "", "printed before the refusal");
}

/// The permissions banner: each folder's file and command permissions, the network and what
/// goes to the server, printed before the executor dials (here it then stops: not logged in).
#[test]
fn connect_prints_the_permissions_of_each_folder() {
    let laptop = default_dirs_laptop();
    let project = laptop.project("proj", &[]);
    let docs = laptop.project("docs", &[]);
    let wire = Tripwire::new();
    let out = laptop
        .command(&[
            "executor",
            "connect",
            "--write-folder",
            project.to_str().unwrap(),
            "--folder",
            docs.to_str().unwrap(),
            "--gateway",
            &wire.url(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("not logged in"), "{stderr}");
    assert!(
        stdout.contains("proj") && stdout.contains("patches allowed"),
        "{stdout}"
    );
    assert!(stdout.contains("read-only sandbox"), "{stdout}");
    assert!(stdout.contains("network"), "{stdout}");
    assert!(stdout.contains("server and its model"), "{stdout}");
    assert!(wire.untouched(), "an executor without a credential dialled");
}

// ----- end to end against an in-test gateway -----

#[test]
fn executor_runs_commands_and_patches_under_its_grants() {
    let laptop = default_dirs_laptop();
    laptop.write_credentials("device-token");
    // log.txt exists: the sandbox cannot let commands create entries directly in a folder that
    // holds a --block exclusion (see executor::sandbox's residual limits).
    let project = laptop.project(
        "proj",
        &[
            ("a.txt", "one\ntwo\n"),
            ("secret/key", "k\n"),
            ("log.txt", ""),
        ],
    );
    let docs = laptop.project("docs", &[("readme", "hello\n")]);
    let secret_outside = laptop.home().join(".ssh");
    std::fs::create_dir_all(&secret_outside).unwrap();
    std::fs::write(secret_outside.join("id"), "private").unwrap();
    let rt = runtime();
    rt.block_on(async {
        let gateway = Gateway::new().await;
        let mut child = spawn_executor(
            &laptop,
            &gateway.url(),
            &[
                "--write-folder",
                project.to_str().unwrap(),
                "--folder",
                docs.to_str().unwrap(),
                "--block",
                project.join("secret").to_str().unwrap(),
            ],
        );
        let (mut ws, auth, hello) = gateway.accept().await;
        assert_eq!(auth, "Bearer device-token");
        let ExecutorFrame::Hello {
            folders,
            device_name,
            ..
        } = &hello
        else {
            panic!("{hello:?}");
        };
        assert_eq!(device_name, "test-laptop");
        let text = serde_json::to_string(&hello).unwrap();
        assert!(!text.contains('/'), "absolute paths in the hello: {text}");
        assert_eq!(folders.len(), 2);

        // Commands run in the folder, under the sandbox.
        let outcome = request(&mut ws, "r1", "proj", shell("echo hi; cat a.txt")).await;
        let Outcome::Completed {
            stdout, exit_code, ..
        } = &outcome
        else {
            panic!("{outcome:?}");
        };
        assert_eq!(stdout, "hi\none\ntwo\n");
        assert_eq!(*exit_code, Some(0));
        for (id, folder, command) in [
            ("r2", "proj", "cat secret/key"),
            ("r3", "docs", "echo x > readme"),
            ("r4", "proj", "cat ../../.ssh/id"),
            ("r5", "proj", "cat ../docs/readme"),
            (
                "r5b",
                "proj",
                "cat ../../.config/agentworks/credentials.json",
            ),
        ] {
            let outcome = request(&mut ws, id, folder, shell(command)).await;
            let Outcome::Completed {
                exit_code, stdout, ..
            } = &outcome
            else {
                panic!("{id}: {outcome:?}");
            };
            assert_ne!(*exit_code, Some(0), "{id}: {command} succeeded: {stdout}");
        }
        assert_eq!(
            std::fs::read_to_string(docs.join("readme")).unwrap(),
            "hello\n"
        );
        let outcome = request(&mut ws, "r6", "nope", shell("true")).await;
        assert!(
            matches!(&outcome, Outcome::Refused { code, .. } if code == "folder_not_shared"),
            "{outcome:?}"
        );
        let outcome = request(
            &mut ws,
            "r7",
            "proj",
            Operation::ExecuteShellCommand {
                command: "true".into(),
                timeout: Some(301),
            },
        )
        .await;
        assert!(
            matches!(&outcome, Outcome::Refused { code, .. } if code == "invalid_timeout"),
            "{outcome:?}"
        );

        // The same request id runs once.
        for _ in 0..2 {
            let outcome = request(&mut ws, "append", "proj", shell("echo line >> log.txt")).await;
            assert!(
                matches!(
                    outcome,
                    Outcome::Completed {
                        exit_code: Some(0),
                        ..
                    }
                ),
                "{outcome:?}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(project.join("log.txt")).unwrap(),
            "line\n"
        );

        // Patches: validated as a whole, applied in the sandbox, revisions reported.
        let good = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+ONE\n";
        let bad = format!("{good}--- /dev/null\n+++ b/secret/new\n@@ -0,0 +1 @@\n+x\n");
        let outcome = request(&mut ws, "p1", "proj", patch("a.txt", &bad)).await;
        assert!(
            matches!(&outcome, Outcome::Refused { code, .. } if code == "blocked"),
            "{outcome:?}"
        );
        assert_eq!(
            std::fs::read_to_string(project.join("a.txt")).unwrap(),
            "one\ntwo\n"
        );
        let outcome = request(
            &mut ws,
            "p2",
            "docs",
            patch(
                "readme",
                "--- a/readme\n+++ b/readme\n@@ -1 +1 @@\n-hello\n+bye\n",
            ),
        )
        .await;
        assert!(
            matches!(&outcome, Outcome::Refused { code, .. } if code == "read_only_folder"),
            "{outcome:?}"
        );
        let outcome = request(&mut ws, "p3", "proj", patch("a.txt", good)).await;
        let Outcome::Patched { files } = &outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "a.txt");
        assert_eq!(files[0].revision, super::harness::revision("ONE\ntwo\n"));
        assert_eq!(
            std::fs::read_to_string(project.join("a.txt")).unwrap(),
            "ONE\ntwo\n"
        );

        // Revocation: close 4001 ends the executor with exit 3.
        ws.close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
            code: 4001.into(),
            reason: "revoked".into(),
        }))
        .await
        .unwrap();
        let code = tokio::task::spawn_blocking(move || wait_exit(&mut child.0))
            .await
            .unwrap();
        assert_eq!(code, Some(3));
    });
    // Receipts live in the private state dir, 0600.
    let receipts = laptop.home().join(".local/state/agentworks/receipts.db");
    assert_eq!(mode(&receipts), 0o600);
    assert_eq!(mode(receipts.parent().unwrap()), 0o700);
}

#[test]
fn a_command_interrupted_by_a_crash_is_never_run_again() {
    let laptop = default_dirs_laptop();
    laptop.write_credentials("device-token");
    let project = laptop.project("proj", &[]);
    let rt = runtime();
    rt.block_on(async {
        let gateway = Gateway::new().await;
        let args = ["--write-folder", project.to_str().unwrap()];
        let mut child = spawn_executor(&laptop, &gateway.url(), &args);
        let (mut ws, _, _) = gateway.accept().await;
        send(
            &mut ws,
            &GatewayFrame::Request {
                request_id: "slow".into(),
                folder: "proj".into(),
                operation: shell("echo ran >> runs.txt; sleep 3"),
            },
        )
        .await;
        // Its echo done, not only the file made: the shell creates runs.txt before echo writes,
        // and a kill between the two left it empty (seen under load).
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(project.join("runs.txt")).unwrap_or_default() != "ran\n" {
            assert!(Instant::now() < deadline, "the command did not run");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        drop(ws);

        // Restarted: the same id is reported interrupted and not run again.
        let mut child = spawn_executor(&laptop, &gateway.url(), &args);
        let (mut ws, _, _) = gateway.accept().await;
        let outcome = request(
            &mut ws,
            "slow",
            "proj",
            shell("echo ran >> runs.txt; sleep 3"),
        )
        .await;
        assert!(
            matches!(outcome, Outcome::Interrupted { .. }),
            "{outcome:?}"
        );
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            std::fs::read_to_string(project.join("runs.txt")).unwrap(),
            "ran\n"
        );

        // Ctrl-C: close 1000, exit 0.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.0.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let close = loop {
            match tokio::time::timeout(Duration::from_secs(20), ws.next())
                .await
                .unwrap()
            {
                Some(Ok(Message::Close(frame))) => break frame,
                Some(Ok(_)) => {}
                other => panic!("no close frame: {other:?}"),
            }
        };
        assert_eq!(close.map(|f| u16::from(f.code)), Some(1000));
        let code = tokio::task::spawn_blocking(move || wait_exit(&mut child.0))
            .await
            .unwrap();
        assert_eq!(code, Some(0));
    });
}
