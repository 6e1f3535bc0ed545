//! Attacks on authority and the device login (issue 10, items 10–13), each performed against
//! the real daemons, a real `agentworks executor connect` (and `agentworks login`) and the
//! scripted model of [`super::agent`], and each asserting that it is refused and that nothing
//! outside changed: no file on a laptop, no token minted, no request sent or replayed.
//!
//! - a viewer or runner binding a chat to a laptop folder or running commands through one;
//!   the patch tool offered for a read-only folder (item 10);
//! - a `workflows:*` or `devices:connect` token approving a device login; a second credential
//!   taking over a device id by connecting with its name, also one recorded before devices
//!   were owned by credentials (item 11);
//! - gatewayd killed while a command runs on the laptop: the outcome reported as "not run",
//!   and a result lost with gatewayd (item 12);
//! - a request id reused with another operation (item 13).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use super::agent::{
    CONFIRM, Model, WAIT, api, calls, code_project, create_chat, result_of, text, tool_names, turn,
    user,
};
use super::harness::{Gatewayd, Laptop, Stack, http, wait_until};

const PATCH: &str = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";

/// agentd with the scripted model, workspaced and gatewayd. Fields drop in order: gatewayd,
/// then the stack (executors are the tests' own locals, dropped before).
struct Bench {
    gw: Gatewayd,
    stack: Stack,
    model: Model,
    gw_port: u16,
}

impl Bench {
    fn start() -> Bench {
        let model = Model::start();
        let (stack, gw_port) = Stack::start_with_gateway_and(&model.config());
        let gw = Gatewayd::start(&stack, gw_port);
        Bench {
            gw,
            stack,
            model,
            gw_port,
        }
    }

    /// The person's device named `name` as `GET /v1/devices` lists it, once it is online and
    /// (with `not`) is not the device `not`.
    fn wait_online(&self, token: &str, name: &str, not: Option<&str>) -> Value {
        self.wait_online_within(token, name, not, WAIT)
    }

    /// [`Bench::wait_online`], waiting at most `within`.
    fn wait_online_within(
        &self,
        token: &str,
        name: &str,
        not: Option<&str>,
        within: Duration,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, body) = api(&self.stack, token, "GET", "/v1/devices", Value::Null);
            assert_eq!(status, 200, "{body}");
            if let Some(device) = body["devices"].as_array().unwrap().iter().find(|d| {
                d["name"] == name && d["online"] == true && not.is_none_or(|n| d["device_id"] != n)
            }) {
                return device.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no online device {name:?} (other than {not:?}): {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `PUT /v1/chats/{chat}/binding` to `device_id`'s folder `repo`.
    fn bind(&self, token: &str, chat: &str, device_id: &str) -> (u16, Value) {
        api(
            &self.stack,
            token,
            "PUT",
            &format!("/v1/chats/{chat}/binding"),
            json!({"device_id": device_id, "folder": "repo", "confirm": CONFIRM}),
        )
    }

    /// gatewayd's record of `request_id` for `user_id` (`POST /v1/outcome` on gatewayd.sock).
    fn outcome(&self, user_id: &str, request_id: &str) -> Result<Value, (String, Value)> {
        self.gw.client().json(
            "/v1/outcome",
            json!({"user_id": user_id, "request_id": request_id}),
        )
    }

    /// `user`'s role on the project `app` (the operator's `member add`).
    fn set_role(&self, user: &str, role: &str) {
        self.stack.admin(
            "members/add",
            json!({"project": "app", "user": user, "role": role}),
        );
    }
}

/// The id of the user `name`, from the operator's list.
pub(super) fn user_id(stack: &Stack, name: &str) -> String {
    stack
        .admin("users/list", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A laptop with `~/src/repo` holding `files`.
fn laptop(prefix: &str, files: &[(&str, &str)]) -> Laptop {
    let files: Vec<(String, &str)> = files
        .iter()
        .map(|(path, content)| (format!("src/repo/{path}"), *content))
        .collect();
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (p.as_str(), *c)).collect();
    let laptop = Laptop::new(prefix, &files);
    std::fs::create_dir_all(laptop.folder("repo")).unwrap();
    laptop
}

/// A running `agentworks executor connect`, its stderr kept in a file beside the laptop's home
/// (outside every shared folder); killed on drop.
struct Executor {
    child: Child,
    log: PathBuf,
}

impl Executor {
    /// `agentworks executor connect --name <name> <share…>` on `laptop` (already logged in).
    fn connect(laptop: &Laptop, name: &str, share: &[&str]) -> Executor {
        let log = laptop.root().join("executor.log");
        let child = laptop
            .command(&[&["executor", "connect", "--name", name], share].concat())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Executor { child, log }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if self.running() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A laptop of `owner` logged in with a new `devices:connect` token and connected as `name`,
/// sharing `~/src/repo` with `flag` (`--write-folder` or `--folder`).
fn connected(
    bench: &Bench,
    owner: &str,
    prefix: &str,
    name: &str,
    flag: &str,
    files: &[(&str, &str)],
) -> (Laptop, Executor) {
    let laptop = laptop(prefix, files);
    let token = bench.stack.token(owner, &["devices:connect"], json!({}));
    laptop.login(&bench.stack, bench.gw_port, &token);
    let repo = laptop.folder("repo");
    let executor = Executor::connect(&laptop, name, &[flag, repo.to_str().unwrap()]);
    (laptop, executor)
}

// ----- item 10: shell needs an editing role -----

/// A viewer or runner of a project binds a chat to a laptop folder, or keeps a binding made
/// while they were an editor and runs commands through it: refused, at binding and at every
/// call, from the live role; nothing reaches gatewayd or the laptop.
#[test]
fn a_viewer_or_runner_cannot_bind_a_laptop_folder_or_run_commands_through_one() {
    let bench = Bench::start();
    user(&bench.stack, "alice");
    code_project(&bench.stack, "app", "alice", &[("server.txt", "x\n")]);
    let bob = user(&bench.stack, "bob");
    let bob_id = user_id(&bench.stack, "bob");
    bench.set_role("bob", "editor");
    let (laptop, _executor) = connected(
        &bench,
        "bob",
        "aw-authority-bob-",
        "bobs-laptop",
        "--write-folder",
        &[("a.txt", "a\n")],
    );
    let repo = laptop.folder("repo");
    let device_id = bench.wait_online(&bob, "bobs-laptop", None)["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = create_chat(&bench.stack, &bob, "app");

    for role in ["viewer", "runner"] {
        bench.set_role("bob", role);
        let (status, body) = bench.bind(&bob, &chat, &device_id);
        assert_eq!(status, 403, "{role}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
        assert_eq!(body["error"]["reason"], "no_authoring_role", "{body}");
        let (_, stored) = api(
            &bench.stack,
            &bob,
            "GET",
            &format!("/v1/chats/{chat}"),
            Value::Null,
        );
        assert!(stored["binding"].is_null(), "{role} bound: {stored}");
    }

    // Bound as an editor, then lowered: every call re-checks the live role.
    bench.set_role("bob", "editor");
    let (status, body) = bench.bind(&bob, &chat, &device_id);
    assert_eq!(status, 200, "{body}");
    for (turn_number, role) in [(1, "viewer"), (2, "runner")] {
        bench.set_role("bob", role);
        let marker = format!("ran-as-{role}.txt");
        bench.model.play(vec![
            calls(&[(
                "c1",
                "execute_shell_command",
                json!({"command": format!("echo ran > {marker}")}),
            )]),
            text("done"),
        ]);
        let events = turn(bench.stack.port, &bob, &chat, "run it").unwrap();
        let result = result_of(&events, "c1");
        assert_eq!(result["ok"], false, "{role}: {result}");
        assert_eq!(result["error"]["code"], "forbidden", "{result}");
        assert_eq!(result["error"]["reason"], "no_authoring_role", "{result}");
        assert_eq!(result["error"]["role"], role, "{result}");
        assert!(!repo.join(&marker).exists(), "a {role} ran a command");
        // Nothing was sent: gatewayd has no record of the call.
        let request_id = format!("chat-{chat}-turn-{turn_number}-call-1");
        let (code, _) = bench.outcome(&bob_id, &request_id).unwrap_err();
        assert_eq!(code, "not_found");
    }

    // The control: an editor again, and the same call runs on the laptop.
    bench.set_role("bob", "editor");
    bench.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": "echo ran > ran-as-editor.txt"}),
        )]),
        text("done"),
    ]);
    let events = turn(bench.stack.port, &bob, &chat, "run it").unwrap();
    assert_eq!(result_of(&events, "c1")["ok"], true, "{events:?}");
    assert!(repo.join("ran-as-editor.txt").exists());
    assert_eq!(std::fs::read_to_string(repo.join("a.txt")).unwrap(), "a\n");
}

/// A chat bound to a folder shared read-only (`--folder`): the model is never offered the
/// patch tool, and a patch call it makes anyway is not dispatched.
#[test]
fn a_read_only_folder_binding_is_offered_no_patch_tool() {
    let bench = Bench::start();
    let alice = user(&bench.stack, "alice");
    let alice_id = user_id(&bench.stack, "alice");
    code_project(&bench.stack, "app", "alice", &[("server.txt", "x\n")]);
    let (laptop, _executor) = connected(
        &bench,
        "alice",
        "aw-authority-ro-",
        "laptop",
        "--folder",
        &[("a.txt", "one\ntwo\nthree\n")],
    );
    let device = bench.wait_online(&alice, "laptop", None);
    assert_eq!(device["folders"][0]["access"], "read_only", "{device}");
    let chat = create_chat(&bench.stack, &alice, "app");
    let (status, body) = bench.bind(&alice, &chat, device["device_id"].as_str().unwrap());
    assert_eq!(status, 200, "{body}");

    bench.model.play(vec![
        calls(&[(
            "p1",
            "diff_patch_workspace_file",
            json!({"filepath": "a.txt", "diff": PATCH}),
        )]),
        calls(&[(
            "s1",
            "execute_shell_command",
            json!({"command": "cat a.txt"}),
        )]),
        text("read it"),
    ]);
    let events = turn(bench.stack.port, &alice, &chat, "patch a.txt").unwrap();
    let patch = result_of(&events, "p1");
    assert_eq!(patch["error"]["code"], "unknown_tool", "{patch}");
    let shell = result_of(&events, "s1");
    assert_eq!(shell["result"]["stdout"], "one\ntwo\nthree\n", "{shell}");
    let requests = bench.model.requests();
    assert_eq!(requests.len(), 3);
    for request in &requests {
        assert_eq!(tool_names(request), ["execute_shell_command"], "{request}");
    }
    assert_eq!(
        std::fs::read_to_string(laptop.folder("repo").join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    let (code, _) = bench
        .outcome(&alice_id, &format!("chat-{chat}-turn-1-call-1"))
        .unwrap_err();
    assert_eq!(code, "not_found", "the patch was dispatched");
}

// ----- item 11: the device login and device ids -----

/// A leaked `workflows:*` (or `devices:connect`) token approves a pending `agentworks login`
/// to mint itself a laptop credential: 403 `insufficient_scope`, the login stays pending and no
/// token is minted. Only a token made with the exclusive `devices:approve` scope approves, and
/// the device grant can never mint one.
#[test]
fn a_workflows_or_devices_connect_token_cannot_approve_a_device_login() {
    use std::io::BufRead;
    let stack = Stack::start();
    stack.admin("users/add", json!({"name": "alice"}));
    let laptop = Laptop::new("aw-authority-login-", &[]);
    let server = format!("http://127.0.0.1:{}", stack.port);
    let mut login = laptop
        .command(&[
            "login",
            "--server",
            &server,
            "--name",
            "attacker-laptop",
            "--yes",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(login.stdout.take().unwrap()).lines();
    let code = loop {
        let line = lines.next().expect("login printed no code").unwrap();
        if let Some(code) = line.strip_prefix("Code: ") {
            break code.trim().to_owned();
        }
    };
    let approve = |token: &str| {
        http(
            stack.port,
            "POST",
            "/v1/device/approve",
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            &json!({"user_code": code}).to_string(),
        )
    };
    let login_tokens = || super::device_login::login_tokens(&stack);

    for scopes in [
        &["workflows:read"][..],
        &["workflows:run"],
        &["workflows:write"],
        &["workflows:read", "workflows:run", "workflows:write"],
        &["devices:connect"],
    ] {
        let token = stack.token("alice", scopes, json!({}));
        let (status, headers, body) = approve(&token);
        assert_eq!(status, 403, "{scopes:?}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"], "insufficient_scope", "{body}");
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("devices:approve"), "{challenge}");
    }
    // Nothing was approved: the CLI polls every 2 s and would have its token by now.
    std::thread::sleep(Duration::from_secs(5));
    assert!(login.try_wait().unwrap().is_none(), "the login finished");
    assert!(login_tokens().is_empty(), "{:?}", login_tokens());
    assert!(!laptop.credentials().exists());

    // devices:approve is never minted by the device grant, nor mixed with another scope.
    let (status, _, body) = http(
        stack.port,
        "POST",
        "/v1/device/code",
        &[("content-type", "application/x-www-form-urlencoded")],
        "client_id=agentworks&scope=devices:approve",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_scope"), "{body}");
    let mixed = stack.ctl(&[
        "token",
        "create",
        "--user",
        "alice",
        "--scope",
        "devices:approve",
        "--scope",
        "workflows:read",
    ]);
    assert!(!mixed.status.success());
    assert!(
        String::from_utf8_lossy(&mixed.stderr).contains("exclusive"),
        "{}",
        String::from_utf8_lossy(&mixed.stderr)
    );

    // A token made for it approves, and is good for nothing else.
    let approver = stack.token("alice", &["devices:approve"], json!({}));
    let (status, _, body) = http(
        stack.port,
        "GET",
        "/v1/chats",
        &[("authorization", &format!("Bearer {approver}"))],
        "",
    );
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = approve(&approver);
    assert_eq!(status, 200, "{body}");
    let mut finished = None;
    wait_until("the login finished", Duration::from_secs(30), || {
        finished = login.try_wait().unwrap();
        finished.is_some()
    });
    assert!(finished.unwrap().success());
    let minted = login_tokens();
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert_eq!(minted[0]["scopes"], json!(["devices:connect"]));
}

/// The takeover: a second `devices:connect` credential of the same person connects with the
/// victim laptop's device name. It gets its own device id (and a name clash notice); the
/// victim's connection is not replaced; a command dispatched to the victim's device runs on
/// the victim's laptop and never reaches the second one; and the terminal client never picks
/// the second one for the person by its name.
#[test]
fn a_second_credential_with_the_same_device_name_cannot_take_over_the_device() {
    let bench = Bench::start();
    let alice = user(&bench.stack, "alice");
    code_project(&bench.stack, "app", "alice", &[("server.txt", "x\n")]);
    let (victim, mut victim_executor) = connected(
        &bench,
        "alice",
        "aw-authority-victim-",
        "laptop",
        "--write-folder",
        &[("who.txt", "victim\n")],
    );
    let victim_id = bench.wait_online(&alice, "laptop", None)["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = create_chat(&bench.stack, &alice, "app");
    assert_eq!(bench.bind(&alice, &chat, &victim_id).0, 200);

    let (attacker, attacker_executor) = connected(
        &bench,
        "alice",
        "aw-authority-attacker-",
        "laptop",
        "--write-folder",
        &[("who.txt", "attacker\n")],
    );
    let attacker_id = bench.wait_online(&alice, "laptop", Some(&victim_id))["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(attacker_id, victim_id);
    wait_until("the attacker is told of the clash", WAIT, || {
        attacker_executor
            .stderr()
            .contains("already named \"laptop\"")
    });
    // The victim's connection was not replaced: it is still online under its id.
    let victim_device = bench.wait_online(&alice, "laptop", None);
    let (_, devices) = api(&bench.stack, &alice, "GET", "/v1/devices", Value::Null);
    let online: Vec<&Value> = devices["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["online"] == true)
        .collect();
    assert_eq!(online.len(), 2, "{devices}");
    assert!(
        online.iter().any(|d| d["device_id"] == victim_id.as_str()),
        "{victim_device} {devices}"
    );
    assert!(victim_executor.running(), "the victim's executor ended");
    assert!(
        !victim_executor.stderr().contains("replaced"),
        "{}",
        victim_executor.stderr()
    );

    bench.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": "cat who.txt; echo ran > proof.txt"}),
        )]),
        text("done"),
    ]);
    let events = turn(bench.stack.port, &alice, &chat, "who are you?").unwrap();
    let result = result_of(&events, "c1");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["result"]["stdout"], "victim\n", "{result}");
    assert!(victim.folder("repo").join("proof.txt").exists());
    assert!(
        !attacker.folder("repo").join("proof.txt").exists(),
        "the request reached the second credential's laptop"
    );

    // With the victim's laptop offline, `agentworks chat --local repo` does not pick the
    // other credential's online "laptop" for the person: it asks for a device id.
    drop(victim_executor);
    wait_until("the victim's device is offline", WAIT, || {
        let (_, devices) = api(&bench.stack, &alice, "GET", "/v1/devices", Value::Null);
        devices["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["device_id"] == victim_id.as_str() && d["online"] == false)
    });
    let home = tempfile::tempdir().unwrap();
    let chat_cli = std::process::Command::new(env!("CARGO_BIN_EXE_agentworks"))
        .args([
            "chat",
            "--project",
            "app",
            "--local",
            "repo",
            "--yes",
            "--server",
        ])
        .arg(format!("http://127.0.0.1:{}", bench.stack.port))
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("XDG_STATE_HOME", home.path().join("state"))
        .env("AGENTWORKS_TOKEN", &alice)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&chat_cli.stderr);
    assert!(!chat_cli.status.success(), "{stderr}");
    assert!(stderr.contains("same name"), "{stderr}");
    assert!(
        stderr.contains(&victim_id) && stderr.contains(&attacker_id),
        "{stderr}"
    );
    let (_, chats) = api(&bench.stack, &alice, "GET", "/v1/chats", Value::Null);
    for listed in chats["chats"].as_array().unwrap() {
        assert_ne!(
            listed["binding"]["device_id"],
            attacker_id.as_str(),
            "{chats}"
        );
    }
}

/// A device recorded before devices were owned by credentials (a database from an earlier
/// gatewayd) is claimed by no connection: a laptop connecting with its name gets a new device
/// id, and a dispatch to the old id finds it offline.
#[test]
fn a_device_recorded_before_credentials_owned_devices_is_claimed_by_no_connection() {
    let model = Model::start();
    // An earlier gatewayd's SQLite file: only the embedded store has one.
    let (stack, gw_port) = Stack::start_with_embedded_gateway_and(&model.config());
    let alice = user(&stack, "alice");
    let alice_id = user_id(&stack, "alice");
    let gateway_dir = stack.state.root().join("gateway");
    std::fs::create_dir_all(&gateway_dir).unwrap();
    std::fs::set_permissions(
        &gateway_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    {
        // The tables as the gatewayd before this change made them, with alice's old device.
        let db = rusqlite::Connection::open(gateway_dir.join("gatewayd.db")).unwrap();
        db.execute_batch(
            "CREATE TABLE devices (
                device_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, name TEXT NOT NULL,
                folders TEXT NOT NULL DEFAULT '[]', version TEXT NOT NULL DEFAULT '',
                created_at_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL,
                UNIQUE (user_id, name));
             CREATE TABLE requests (
                request_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, device_id TEXT NOT NULL,
                folder TEXT NOT NULL, kind TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN ('pending', 'done', 'unknown')),
                outcome TEXT, reason TEXT, created_at_ms INTEGER NOT NULL,
                finished_at_ms INTEGER);
             CREATE INDEX devices_by_user ON devices (user_id, last_seen_ms);",
        )
        .unwrap();
        let now = agentworks_agent::identity::store::now_ms();
        db.execute(
            "INSERT INTO devices VALUES ('dev_legacy', ?1, 'laptop', ?2, '0.1.0', ?3, ?3)",
            rusqlite::params![
                alice_id,
                r#"[{"alias":"repo","access":"read_write","downloads":false}]"#,
                now
            ],
        )
        .unwrap();
    }
    let gw = Gatewayd::start(&stack, gw_port);
    let bench = Bench {
        gw,
        stack,
        model,
        gw_port,
    };
    let (laptop, executor) = connected(
        &bench,
        "alice",
        "aw-authority-legacy-",
        "laptop",
        "--write-folder",
        &[],
    );
    let device = bench.wait_online(&alice, "laptop", None);
    assert_ne!(device["device_id"], "dev_legacy", "{device}");
    wait_until("the clash is noticed", WAIT, || {
        executor.stderr().contains("already named \"laptop\"")
    });
    let (code, _) = bench
        .gw
        .client()
        .json(
            "/v1/dispatch",
            json!({"user_id": alice_id, "device_id": "dev_legacy", "folder": "repo",
                   "request_id": "legacy-1",
                   "operation": {"kind": "execute_shell_command", "command": "echo ran > proof.txt"}}),
        )
        .unwrap_err();
    assert_eq!(code, "device_offline");
    assert!(!laptop.folder("repo").join("proof.txt").exists());
}

// ----- item 12: an outcome lost with gatewayd -----

/// alice's laptop connected and a chat bound to it: (bench, alice's token and id, laptop,
/// executor, chat).
fn bound_chat(prefix: &str) -> (Bench, String, String, Laptop, Executor, String) {
    let bench = Bench::start();
    let alice = user(&bench.stack, "alice");
    let alice_id = user_id(&bench.stack, "alice");
    code_project(&bench.stack, "app", "alice", &[("server.txt", "x\n")]);
    let (laptop, executor) = connected(&bench, "alice", prefix, "laptop", "--write-folder", &[]);
    let device_id = bench.wait_online(&alice, "laptop", None)["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = create_chat(&bench.stack, &alice, "app");
    assert_eq!(bench.bind(&alice, &chat, &device_id).0, 200);
    (bench, alice, alice_id, laptop, executor, chat)
}

/// The command of these tests: one line to stdout and to `started.txt`, then a long sleep that
/// the lost connection cuts short (the executor stops a command whose connection is gone).
fn started_then_sleep(sleeper: &str) -> String {
    format!("echo started | tee -a started.txt; {sleeper}; echo finished > finished.txt")
}

/// gatewayd is SIGKILLed while a command runs on the laptop and stays down past the request's
/// deadline: the model is told the outcome is unknown (`outcome_unknown`), never that the call
/// was not run. Once gatewayd is back, the laptop's receipt recovers the real outcome.
#[test]
fn gatewayd_killed_mid_command_is_reported_outcome_unknown_never_not_run() {
    let (mut bench, alice, alice_id, laptop, _executor, chat) = bound_chat("aw-authority-unknown-");
    let repo = laptop.folder("repo");
    let sleeper = "sleep 41.5";
    bench.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": started_then_sleep(sleeper), "timeout": 3}),
        )]),
        text("noted"),
    ]);
    let (port, token, id) = (bench.stack.port, alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "run it"));
    // tee writes to its stdout before its file, so "started" is in the command's output once
    // the file holds it (the file alone appears at tee's open, before it writes anything).
    wait_until("the command runs on the laptop", WAIT, || {
        std::fs::read_to_string(repo.join("started.txt")).is_ok_and(|s| s == "started\n")
    });
    let killed = Instant::now();
    bench.gw.child.kill().unwrap();
    bench.gw.child.wait().unwrap();

    // The request's deadline (3 s + 30 s) passes with gatewayd down.
    let events = running.join().unwrap().unwrap();
    eprintln!(
        "outcome_unknown reported {:?} after the kill",
        killed.elapsed()
    );
    let result = result_of(&events, "c1");
    assert_eq!(result["ok"], false, "{result}");
    assert_eq!(result["error"]["code"], "outcome_unknown", "{result}");
    let message = result["error"]["message"].as_str().unwrap();
    assert!(!message.contains("not run"), "{message}");
    assert!(message.contains("unknown"), "{message}");
    let request_id = format!("chat-{chat}-turn-1-call-1");
    assert_eq!(
        result["error"]["request_id"],
        request_id.as_str(),
        "{result}"
    );
    assert!(!repo.join("finished.txt").exists());

    // gatewayd comes back (its record says unknown); the laptop reconnects, and the receipt
    // query recovers what really happened; the request is never run again.
    bench.gw = Gatewayd::start(&bench.stack, bench.gw_port);
    let recorded = bench.outcome(&alice_id, &request_id).unwrap();
    assert_eq!(recorded["state"], "unknown", "{recorded}");
    let dispatch = json!({"user_id": alice_id, "device_id": "", "folder": "repo",
        "request_id": request_id,
        "operation": {"kind": "execute_shell_command", "command": started_then_sleep(sleeper), "timeout": 3}});
    let mut dispatch = dispatch;
    // The laptop has been redialling for the whole deadline, so its backoff has grown to its
    // cap; its next dial may be that far away when gatewayd comes back.
    let redial = agentworks_laptop::connect::LONGEST_REDIAL_WAIT;
    dispatch["device_id"] =
        bench.wait_online_within(&alice, "laptop", None, redial + WAIT)["device_id"].clone();
    let reconnected = Instant::now();
    let mut recovered = Value::Null;
    wait_until("the receipt is recovered", WAIT, || {
        recovered = bench
            .gw
            .client()
            .json("/v1/recover", dispatch.clone())
            .unwrap();
        recovered["recovery"] != "unsettled"
    });
    eprintln!(
        "receipt recovered {:?} after the laptop reconnected",
        reconnected.elapsed()
    );
    assert_eq!(recovered["recovery"], "settled", "{recovered}");
    assert_eq!(recovered["from_receipt"], true, "{recovered}");
    let outcome = &recovered["state"]["outcome"];
    assert_eq!(outcome["status"], "completed", "{recovered}");
    assert_eq!(outcome["stdout"], "started\n", "{recovered}");
    assert!(
        outcome["cancelled"] == true || outcome["timed_out"] == true,
        "{recovered}"
    );
    assert_eq!(
        bench.outcome(&alice_id, &request_id).unwrap()["state"],
        "done"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("started.txt")).unwrap(),
        "started\n",
        "the command ran more than once"
    );
    assert!(!repo.join("finished.txt").exists());
}

/// gatewayd is SIGKILLed while a command runs on the laptop and restarted at once: the result
/// whose frame was lost with it reaches the model, recovered from the laptop's private receipt
/// by a receipt query (gatewayd's own record only says unknown), and the command ran once.
#[test]
fn a_result_lost_when_gatewayd_dies_is_recovered_from_the_laptop_receipt() {
    let (mut bench, alice, alice_id, laptop, _executor, chat) = bound_chat("aw-authority-recover-");
    let repo = laptop.folder("repo");
    bench.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": started_then_sleep("sleep 42.5"), "timeout": 60}),
        )]),
        text("noted"),
    ]);
    let (port, token, id) = (bench.stack.port, alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "run it"));
    // tee writes to its stdout before its file, so "started" is in the command's output once
    // the file holds it (the file alone appears at tee's open, before it writes anything).
    wait_until("the command runs on the laptop", WAIT, || {
        std::fs::read_to_string(repo.join("started.txt")).is_ok_and(|s| s == "started\n")
    });
    let killed = Instant::now();
    bench.gw.child.kill().unwrap();
    bench.gw.child.wait().unwrap();
    bench.gw = Gatewayd::start(&bench.stack, bench.gw_port);
    let back = Instant::now();

    let events = running.join().unwrap().unwrap();
    // A measurement, not an assertion: how long the recovery took.
    eprintln!(
        "recovered: gatewayd back {:?} after the kill, the result reached the model {:?} after that",
        back - killed,
        back.elapsed()
    );
    let result = result_of(&events, "c1");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["result"]["stdout"], "started\n", "{result}");
    assert_eq!(result["result"]["cancelled"], true, "{result}");
    assert_eq!(
        super::agent::tool_results(bench.model.requests().last().unwrap())[0].1["result"]["stdout"],
        "started\n"
    );
    // gatewayd's record now holds the laptop's outcome; the command ran once.
    let request_id = format!("chat-{chat}-turn-1-call-1");
    let recorded = bench.outcome(&alice_id, &request_id).unwrap();
    assert_eq!(recorded["state"], "done", "{recorded}");
    assert_eq!(recorded["outcome"]["stdout"], "started\n", "{recorded}");
    assert_eq!(
        std::fs::read_to_string(repo.join("started.txt")).unwrap(),
        "started\n"
    );
    assert!(!repo.join("finished.txt").exists());
}

// ----- item 13: a request id reused with another payload -----

/// A request id already used is sent again with another operation (or folder): refused with
/// `request_id_reused`, never answered with the first one's outcome, and nothing runs on the
/// laptop. The same request again is still answered from its record, not re-sent.
#[test]
fn a_reused_request_id_with_another_operation_is_refused_not_replayed() {
    let bench = Bench::start();
    let alice = user(&bench.stack, "alice");
    let alice_id = user_id(&bench.stack, "alice");
    let (laptop, _executor) = connected(
        &bench,
        "alice",
        "aw-authority-reuse-",
        "laptop",
        "--write-folder",
        &[],
    );
    let device_id = bench.wait_online(&alice, "laptop", None)["device_id"].clone();
    let repo = laptop.folder("repo");
    let dispatch = |folder: &str, command: &str| {
        json!({"user_id": alice_id, "device_id": device_id, "folder": folder,
               "request_id": "chat-c-turn-1-call-1",
               "operation": {"kind": "execute_shell_command", "command": command}})
    };
    let first = bench
        .gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch("repo", "echo one >> log.txt; echo one"),
        )
        .unwrap();
    assert_eq!(first["state"], "done", "{first}");
    assert_eq!(first["outcome"]["stdout"], "one\n", "{first}");

    for (folder, command) in [
        ("repo", "echo two >> log.txt; echo two"),
        ("other", "echo one >> log.txt; echo one"),
    ] {
        let (code, details) = bench
            .gw
            .client()
            .json("/v1/dispatch", dispatch(folder, command))
            .unwrap_err();
        assert_eq!(code, "request_id_reused", "{folder} {command}: {details}");
        assert!(!details.to_string().contains("one\\n"), "{details}");
        // A recovery under the reused id is refused the same way.
        let (code, _) = bench
            .gw
            .client()
            .json("/v1/recover", dispatch(folder, command))
            .unwrap_err();
        assert_eq!(code, "request_id_reused");
    }
    let again = bench
        .gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch("repo", "echo one >> log.txt; echo one"),
        )
        .unwrap();
    assert_eq!(again, first);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        std::fs::read_to_string(repo.join("log.txt")).unwrap(),
        "one\n"
    );
}
