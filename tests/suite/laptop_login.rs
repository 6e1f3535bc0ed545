//! Which account a laptop serves (issue 42, item 2). A code from `agentworks login` can be
//! approved by anyone who learns it, with their own account; the laptop then served that
//! account's agent while `login` said only "Logged in" and `executor connect` "connected as
//! device dev_…". Here the real CLI runs on a real pseudo-terminal against a real agentd (and
//! gatewayd), a second account approves the code over real HTTP, and the person answers the
//! question the CLI asks; without a terminal it takes `--yes`. `executor connect` names the
//! account before it shares anything and on every (re)connect.

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::attack_sandbox::{drain, type_into, user_pty};
use super::device_login::bearer_approve;
use super::harness::{Gatewayd, Laptop, Stack, http, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// `agentworks login` on a new pseudo-terminal: its stdin, stdout and stderr are the
/// terminal, and what it shows is collected from the other side.
struct OnTerminal {
    child: Child,
    master: OwnedFd,
    screen: Arc<Mutex<String>>,
}

impl OnTerminal {
    fn spawn(laptop: &Laptop, args: &[&str]) -> OnTerminal {
        let (master, slave, _) = user_pty(0, 0);
        let screen = drain(&master);
        let child = laptop
            .command(args)
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .unwrap();
        OnTerminal {
            child,
            master,
            screen,
        }
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().replace('\r', "")
    }

    /// Waits until the terminal shows `text`; fails with the screen if the CLI exits first.
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.screen().contains(text) {
            if let Some(status) = self.child.try_wait().unwrap() {
                // What it printed last may still be on its way from the terminal.
                std::thread::sleep(Duration::from_millis(200));
                if self.screen().contains(text) {
                    return;
                }
                panic!(
                    "login exited ({status}) before showing {text:?}:\n{}",
                    self.screen()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {text:?}:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The code the CLI printed (`Code: …`).
    fn code(&mut self) -> String {
        self.wait_for("Waiting for approval");
        self.screen()
            .lines()
            .find_map(|l| l.strip_prefix("Code: "))
            .expect("a Code: line")
            .trim()
            .to_owned()
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(200));
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "login did not end:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OnTerminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Approves the pending login `code` with a `devices:approve` token of `user`'s own, over the
/// public API (as anyone who learnt the code can).
fn approve_as(stack: &Stack, user: &str, code: &str) {
    let token = stack.token(user, &["devices:approve"], json!({}));
    let (status, _, body) = bearer_approve(stack, &token, code);
    assert_eq!(status, 200, "{body}");
}

/// `user`'s `devices:connect` tokens: (id, revoked).
fn laptop_tokens(stack: &Stack, user: &str) -> Vec<(String, bool)> {
    stack
        .admin("tokens/list", json!({"user": user}))
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["scopes"] == json!(["devices:connect"]))
        .map(|t| {
            (
                t["id"].as_str().unwrap_or_default().to_owned(),
                !t["revoked_at_ms"].is_null(),
            )
        })
        .collect()
}

/// The attack: alice runs `agentworks login`, mallory (another account) learns the code and
/// approves it with her own. The laptop used to store mallory's credential and say "Logged
/// in": every folder alice then shared went to mallory's agent. Now it names mallory and asks;
/// alice says no, and nothing is stored and mallory's new token is revoked. Her own approval,
/// confirmed, is stored with her account.
#[test]
fn a_login_approved_by_another_account_is_named_and_kept_only_when_confirmed() {
    let stack = Stack::start();
    for user in ["alice", "mallory"] {
        stack.admin("users/add", json!({"name": user}));
    }
    let laptop = Laptop::new("aw-login-account-", &[]);
    let server = format!("http://127.0.0.1:{}", stack.port);
    let login = ["login", "--server", &server, "--name", "alice-laptop"];

    let mut terminal = OnTerminal::spawn(&laptop, &login);
    let code = terminal.code();
    approve_as(&stack, "mallory", &code);
    terminal.wait_for(&format!("Signed in as mallory on {server}."));
    terminal.wait_for("Use this laptop for mallory? [y/N]");
    type_into(&terminal.master, "n\n");
    let status = terminal.wait_exit();
    let screen = terminal.screen();
    assert!(!status.success(), "{screen}");
    assert!(
        screen.contains("not logged in: this laptop was not kept for mallory; nothing was stored, and the token was revoked on the server"),
        "{screen}"
    );
    assert!(!laptop.credentials().exists(), "{screen}");
    let minted = laptop_tokens(&stack, "mallory");
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert!(minted[0].1, "mallory's laptop token is revoked: {minted:?}");

    // alice's own approval, confirmed: stored with her account. The terminal shows the two
    // lines the approval page shows side by side, to compare.
    let mut terminal = OnTerminal::spawn(&laptop, &login);
    let code = terminal.code();
    let screen = terminal.screen();
    let shown: Vec<String> = screen
        .lines()
        .skip_while(|l| !l.starts_with("Device: "))
        .take(2)
        .map(str::to_owned)
        .collect();
    assert_eq!(
        shown,
        ["Device: alice-laptop".to_owned(), format!("Code: {code}")],
        "{screen}"
    );
    approve_as(&stack, "alice", &code);
    terminal.wait_for("Use this laptop for alice? [y/N]");
    type_into(&terminal.master, "y\n");
    let status = terminal.wait_exit();
    let screen = terminal.screen();
    assert!(status.success(), "{screen}");
    assert!(
        screen.contains(&format!("Signed in as alice on {server}.")),
        "{screen}"
    );
    assert!(screen.contains("Logged in as alice;"), "{screen}");
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(laptop.credentials()).unwrap()).unwrap();
    assert_eq!(stored["account"], "alice", "{stored}");
    let kept = laptop_tokens(&stack, "alice");
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(!kept[0].1, "{kept:?}");
}

/// Without a terminal nobody can be asked: the device login is refused before any code is
/// shown (so nobody approves a login that cannot be confirmed), naming `--yes`; with `--yes`
/// it goes ahead and still prints the account. No login is left pending by the refusal.
#[test]
fn without_a_terminal_the_device_login_needs_yes_and_still_names_the_account() {
    let stack = Stack::start();
    stack.admin("users/add", json!({"name": "alice"}));
    let laptop = Laptop::new("aw-login-yes-", &[]);
    let server = format!("http://127.0.0.1:{}", stack.port);
    let out = laptop
        .command(&["login", "--server", &server, "--name", "ci-box"])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("--yes"), "{stderr}");
    assert!(
        !stdout.contains("Code: "),
        "no code was asked for: {stdout}"
    );
    assert!(!laptop.credentials().exists());
    // The device name is shown beside the code on the approval page: one that could reorder
    // what the page shows (U+202E) is refused by the CLI and by the server.
    let spoofed = "laptop\u{202e}KJHG-FDCB";
    let out = laptop
        .command(&["login", "--server", &server, "--name", spoofed, "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--name"),
        "{out:?}"
    );
    let (status, _, body) = http(
        stack.port,
        "POST",
        "/v1/device/code",
        &[("content-type", "application/json")],
        &json!({"device_name": spoofed}).to_string(),
    );
    assert_eq!(status, 400, "{body}");

    let mut child = laptop
        .command(&["login", "--server", &server, "--name", "ci-box", "--yes"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let code = loop {
        let line = lines.next().expect("login printed no code").unwrap();
        if let Some(code) = line.strip_prefix("Code: ") {
            break code.trim().to_owned();
        }
    };
    let approved = stack.ctl(&["login", "approve", &code, "--user", "alice"]);
    assert!(approved.status.success(), "{approved:?}");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(child.wait().unwrap().success(), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| *l == format!("Signed in as alice on {server}.")),
        "{rest:?}"
    );
    assert!(laptop.credentials().exists());
}

/// `executor connect` says whose agent the folders go to before it dials (from the account
/// stored at login), and on every connect the gateway names the account again: here once,
/// then after gatewayd restarts and the executor reconnects.
#[test]
fn executor_connect_names_the_account_before_sharing_and_on_every_reconnect() {
    let (stack, gw_port) = Stack::start_with_gateway();
    let mut gw = Gatewayd::start(&stack, gw_port);
    stack.admin("users/add", json!({"name": "alice"}));
    let laptop = Laptop::new("aw-login-connect-", &[("src/repo/a.txt", "a\n")]);
    laptop.login(
        &stack,
        gw_port,
        &stack.token("alice", &["devices:connect"], json!({})),
    );
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(laptop.credentials()).unwrap()).unwrap();
    assert_eq!(stored["account"], "alice", "{stored}");

    let stdout = laptop.root().join("connect-stdout");
    let stderr = laptop.root().join("connect-stderr");
    let repo = laptop.folder("repo");
    let mut child = laptop
        .command(&["executor", "connect", "--name", "laptop", "--write-folder"])
        .arg(&repo)
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let connected = || {
        std::fs::read_to_string(&stderr)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with("connected as device ")
                    && l.contains(" for the account alice, sharing repo;")
            })
            .count()
    };
    wait_until("the executor is connected", WAIT, || connected() == 1);
    let printed = std::fs::read_to_string(&stdout).unwrap();
    let permissions = printed.find("Sharing these folders with the server:");
    let account = printed.find(&format!(
        "They are shared with the account alice on http://127.0.0.1:{}",
        stack.port
    ));
    assert!(
        matches!((permissions, account), (Some(p), Some(a)) if p < a),
        "{printed}"
    );

    gw.stop();
    gw = Gatewayd::start(&stack, gw_port);
    wait_until("the executor is connected again", WAIT, || connected() == 2);
    drop(gw);
    let _ = child.kill();
    let _ = child.wait();
}
