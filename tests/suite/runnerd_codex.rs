//! The real Codex (`tests/codex`, pinned) run by the real runnerd, against a scripted Responses
//! API server on loopback, through runnerd's socket as agentd calls it: a Run turn reads the
//! project through `project/` and cannot write it; a Builder turn writes within its grants but
//! not a protected or blocked file; a second turn resumes the thread; Stop ends the CLI's tree;
//! the operator's key reaches the upstream and nothing in the sandbox; the turn's capability is
//! refused once the turn ended; the sandbox keeps the state root, other runtimes, the key file
//! and the daemons' sockets out of reach.

use super::harness::*;
use super::runner_support::codex_binary;
use super::runner_support::responses::{Reply, ScriptedResponses};
use serde_json::{Value, json};
use std::time::Duration;

const TURN: Duration = Duration::from_secs(60);

/// A state root with project `p`, the operator's key in a file, and a `codex` provider whose
/// upstream is `model`.
struct Setup {
    state: StateRoot,
    key: String,
}

fn setup(model: &ScriptedResponses, extra: &str) -> Setup {
    setup_in(StateRoot::new(), new_key(), model, extra)
}

fn new_key() -> String {
    format!("sk-operator-{}", hex::encode(rand::random::<[u8; 16]>()))
}

fn setup_in(state: StateRoot, key: String, model: &ScriptedResponses, extra: &str) -> Setup {
    state.project(
        "p",
        &[
            ("hello.txt", "hello from the project\n"),
            ("workflow.json", "{}\n"),
            ("secret/plans.txt", "blocked\n"),
            ("docs/readme.md", "docs\n"),
        ],
    );
    let key_file = state.root().join("provider.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    state.set_config(&format!(
        "[runnerd]\nmax_processes = 256\n{extra}\n[runnerd.providers.codex]\ndriver = \"codex\"\nexecutable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{}\"\nkey_file = \"{}\"\n",
        codex_binary().display(),
        model.base_url(),
        key_file.display()
    ));
    Setup { state, key }
}

fn request(chat: &str, mode: &str, prompt: &str) -> Value {
    json!({
        "chat_id": chat,
        "user_id": "user-1",
        "project": "p",
        "provider": "codex",
        "mode": mode,
        "guard": {"write_paths": [""], "blocked_paths": ["secret"]},
        "prompt": prompt,
    })
}

#[test]
fn a_run_turn_reads_the_project_and_cannot_write_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", "cat project/hello.txt"),
            Reply::exec_command("c2", "echo new > project/new.txt; echo rc=$?"),
            Reply::exec_command("c3", "echo changed >> project/hello.txt; echo rc=$?"),
            Reply::Text("The project says hello.".into()),
        ]))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-run", "run", "What does hello.txt say?"))
        .finish(TURN);
    ended(&events);
    assert_eq!(events[0]["type"], "started");
    assert!(!of_type(&events, "session").is_empty(), "{events:#?}");
    assert!(output_of(&events, "cat project/hello.txt").contains("hello from the project"));
    assert!(
        output_of(&events, "project/new.txt").contains("rc=1"),
        "{events:#?}"
    );
    assert!(output_of(&events, ">> project/hello.txt").contains("rc=1"));
    let texts: Vec<&str> = of_type(&events, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect();
    assert!(
        texts.concat().contains("The project says hello."),
        "{texts:?}"
    );
    // The gateway counted every model request of the turn.
    let usage = of_type(&events, "usage");
    assert_eq!(usage.last().unwrap()["input_tokens"], 44, "{usage:?}");
    let project = s.state.documents().join("p");
    assert!(!project.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(project.join("hello.txt")).unwrap(),
        "hello from the project\n"
    );
    // The upstream got the operator's key; the CLI had only the turn's capability.
    let requests = model.requests();
    assert_eq!(requests.len(), 4);
    for r in &requests {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {}", s.key).as_str())
        );
    }
}

#[test]
fn a_builder_turn_writes_within_its_grants_only() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", "echo made > project/docs/new.md; echo rc=$?"),
            Reply::exec_command("c2", "echo '{\"x\":1}' > project/workflow.json; echo rc=$?"),
            Reply::exec_command("c3", "cat project/secret/plans.txt; echo rc=$?"),
            Reply::Text("done".into()),
        ]))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-build", "builder", "edit"))
        .finish(TURN);
    ended(&events);
    let project = s.state.documents().join("p");
    assert!(
        output_of(&events, "docs/new.md").contains("rc=0"),
        "{events:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("docs/new.md")).unwrap(),
        "made\n"
    );
    assert!(
        output_of(&events, "workflow.json").contains("rc=1"),
        "{events:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("workflow.json")).unwrap(),
        "{}\n"
    );
    let blocked = output_of(&events, "secret/plans.txt");
    assert!(
        blocked.contains("rc=1") && !blocked.contains("blocked\n"),
        "{blocked}"
    );
}

#[test]
fn a_second_turn_resumes_the_thread_under_the_same_key_only() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::Text("first answer".into()),
            Reply::Text("second answer".into()),
            Reply::Text("third answer".into()),
        ]))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let first = runnerd
        .turn(&request(
            "chat-resume",
            "run",
            "remember the word tangerine",
        ))
        .finish(TURN);
    ended(&first);
    let key = first[0]["session_key"].as_str().unwrap().to_owned();
    let session = of_type(&first, "session")[0]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut second = request("chat-resume", "run", "which word?");
    second["resume"] = json!({"session_id": session, "session_key": key});
    let second = runnerd.turn(&second).finish(TURN);
    ended(&second);
    assert_eq!(
        of_type(&second, "session")[0]["session_id"],
        session.as_str()
    );
    let input = model.requests()[1].body["input"].to_string();
    assert!(input.contains("tangerine"), "{input}");
    assert!(input.contains("first answer"), "{input}");
    // Under another key (another chat's), the session is not resumed: a new thread starts.
    let mut third = request("chat-resume", "run", "and now?");
    third["resume"] = json!({"session_id": session, "session_key": "0".repeat(64)});
    let third = runnerd.turn(&third).finish(TURN);
    ended(&third);
    assert_ne!(
        of_type(&third, "session")[0]["session_id"],
        session.as_str()
    );
    assert!(
        !model.requests()[2].body["input"]
            .to_string()
            .contains("tangerine")
    );
}

#[test]
fn stop_ends_the_clis_whole_tree() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![Reply::exec_command(
            "c1",
            "sleep 287 & sleep 288",
        )]))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let turn = runnerd.turn(&request("chat-stop", "run", "wait"));
    let started = turn.next(TURN);
    let turn_id = started["turn_id"].as_str().unwrap().to_owned();
    // Wait for the command to run.
    let mut seen = Vec::new();
    loop {
        let event = turn.next(TURN);
        let call = event["type"] == "tool_call";
        seen.push(event);
        if call {
            break;
        }
    }
    wait_until("the sleeps run", Duration::from_secs(20), || {
        !processes_with("sleep 288").is_empty() && !processes_with("sleep 287").is_empty()
    });
    // The turn's capability, read (as root, from outside) from the CLI's environment, works
    // now and is refused once the turn has ended.
    let codex = codex_processes(&s.state);
    let (codex_pid, capability) = codex.first().expect("the turn's codex runs").clone();
    let gateway = gateway_url(&s.state);
    assert_ne!(gateway_status(&gateway, &capability), 401);
    let answer = runnerd.cancel(&turn_id);
    assert_eq!(answer["cancelled"], turn_id.as_str(), "{answer}");
    let events = turn.finish(Duration::from_secs(10));
    let last = events.last().unwrap();
    assert_eq!(last["code"], "cancelled", "{events:#?}");
    wait_until("the sleeps are gone", Duration::from_secs(3), || {
        processes_with("sleep 288").is_empty() && processes_with("sleep 287").is_empty()
    });
    assert!(!std::path::Path::new(&format!("/proc/{codex_pid}")).exists());
    assert_eq!(gateway_status(&gateway, &capability), 401);
    // runnerd goes on.
    assert_eq!(runnerd.get("/v1/health")["status"], "ok");
}

/// The Codex processes of the turns on `state` (others run beside them in parallel tests), each
/// with its pid and `AGENTWORKS_MODEL_KEY`, read as root from outside.
fn codex_processes(state: &StateRoot) -> Vec<(String, String)> {
    let codex = codex_binary().display().to_string();
    let home = format!("CODEX_HOME={}", state.root().display());
    let mut found = Vec::new();
    for process in processes_with(&codex) {
        let pid = process.split(':').next().unwrap().to_owned();
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if !vars.iter().any(|v| v.starts_with(&home)) {
            continue;
        }
        if let Some(capability) = vars
            .iter()
            .find_map(|v| v.strip_prefix("AGENTWORKS_MODEL_KEY="))
        {
            found.push((pid, capability.to_owned()));
        }
    }
    found
}

/// The model gateway's base URL, from a runtime's generated Codex config.
fn gateway_url(state: &StateRoot) -> String {
    let runtimes = state.root().join("runner/runtimes");
    for entry in std::fs::read_dir(&runtimes).unwrap().flatten() {
        if let Ok(config) = std::fs::read_to_string(entry.path().join("codex/config.toml")) {
            let line = config
                .lines()
                .find_map(|l| l.trim().strip_prefix("base_url = "))
                .expect("a base_url in the config");
            return line.trim_matches('"').to_owned();
        }
    }
    panic!(
        "no runtime with a Codex config under {}",
        runtimes.display()
    )
}

/// The status of a model request to the gateway with `capability` as the bearer token.
fn gateway_status(base_url: &str, capability: &str) -> u16 {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", &format!("authorization: Bearer {capability}")])
        .args(["-H", "content-type: application/json", "-d", "{}"])
        .arg(format!("{base_url}/responses"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn the_sandbox_keeps_the_key_state_runtimes_and_sockets_out() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let state = StateRoot::new();
    let root = state.root().to_owned();
    let key = new_key();
    let key_part = &key[..20];
    let other = root.join("runner/runtimes/0123456789abcdef0123456789abcdef");
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", &format!("cat {}/provider.key; echo rc=$?", root.display())),
            Reply::exec_command(
                "c2",
                &format!("cat {}/AGENTS.md; echo rc=$?", other.display()),
            ),
            Reply::exec_command("c3", &format!("ls {}/files {}; echo rc=$?", root.display(), root.display())),
            Reply::exec_command(
                "c4",
                &format!(
                    "for s in runnerd workspaced agentd gatewayd; do curl -sS --unix-socket {}/run/$s.sock http://x/v1/health; echo rc=$?; done",
                    root.display()
                ),
            ),
            Reply::exec_command(
                "c7",
                &format!("cat {}/documents/other/private.txt; echo rc=$?", root.display()),
            ),
            Reply::exec_command(
                "c5",
                &format!(
                    "env; grep -rsF \"$(echo {} | base64 -d)\" . /proc/self/environ /tmp 2>/dev/null | head -3; echo end",
                    base64_of(key_part)
                ),
            ),
            Reply::exec_command("c6", "cat project/../../AGENTS.md >/dev/null; ls project/; echo rc=$?"),
            Reply::Text("looked".into()),
        ]))
        .unwrap();
    let s = setup_in(state, key.clone(), &model, "");
    // Another chat's runtime exists beside this one's; workspaced's state too.
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("AGENTS.md"), "another chat's guidance").unwrap();
    std::fs::create_dir_all(root.join("files")).unwrap();
    s.state
        .project("other", &[("private.txt", "another project's secret")]);
    std::fs::write(root.join("files/receipts.db"), "receipts").unwrap();
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-probe", "builder", "probe"))
        .finish(TURN);
    ended(&events);
    let key_read = output_of(&events, "provider.key");
    assert!(
        key_read.contains("rc=1") && !key_read.contains(&key),
        "{key_read}"
    );
    let other_read = output_of(&events, "0123456789abcdef");
    assert!(
        other_read.contains("rc=1") && !other_read.contains("another chat"),
        "{other_read}"
    );
    let state_read = output_of(&events, "/files ");
    assert!(
        state_read.contains("rc=2") && !state_read.contains("receipts.db"),
        "{state_read}"
    );
    // Every daemon's socket: runnerd's listens; a sandboxed command cannot make a Unix socket.
    let socket = output_of(&events, "--unix-socket");
    assert!(
        !socket.contains("agentworks-runnerd") && !socket.contains("rc=0"),
        "{socket}"
    );
    assert_eq!(socket.matches("rc=").count(), 4, "{socket}");
    let other_project = output_of(&events, "other/private.txt");
    assert!(
        other_project.contains("rc=1") && !other_project.contains("another project's"),
        "{other_project}"
    );
    let search = output_of(&events, "grep -rsF");
    assert!(search.contains("HOME="), "env ran: {search}");
    assert!(!search.contains(&key), "{search}");
    assert!(
        !search.contains("awcap_"),
        "a command saw the turn's capability: {search}"
    );
    // Nothing under the runtime holds the key, after the turn either.
    let runtimes = root.join("runner/runtimes");
    for file in all_files(&runtimes) {
        if let Ok(text) = std::fs::read(runtimes.join(&file)) {
            assert!(
                !String::from_utf8_lossy(&text).contains(key_part),
                "{file} holds the key"
            );
        }
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[test]
fn an_upstream_that_refuses_the_key_ends_the_turn_with_upstream_refused() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![Reply::RefuseKey]))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-refused", "run", "hi"))
        .finish(TURN);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error", "{events:#?}");
    assert_eq!(last["code"], "upstream_refused", "{events:#?}");
    let message = last["message"].as_str().unwrap();
    assert!(message.contains("[runnerd.providers.codex]"), "{message}");
    assert!(!message.contains(&s.key), "{message}");
}

/// A provider whose executable is this shell script (a CLI that misbehaves on cue).
fn fake_cli(state: &StateRoot, name: &str, script: &str) -> String {
    let path = state.root().join(format!("cli-{name}/{name}"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

fn fake_provider_config(executable: &str, runnerd: &str) -> String {
    format!(
        "[runnerd]\n{runnerd}\n[runnerd.providers.codex]\ndriver = \"codex\"\nexecutable = \"{executable}\"\nmodel = \"scripted\"\nupstream = \"http://127.0.0.1:9/v1\"\n"
    )
}

#[test]
fn a_cli_that_fails_or_exits_mid_turn_is_a_turn_error_with_its_last_words() {
    let state = StateRoot::new();
    state.project("p", &[("hello.txt", "hi")]);
    let broken = fake_cli(
        &state,
        "broken",
        "echo 'line one' >&2\necho 'error: the config is broken' >&2\nexit 3",
    );
    state.set_config(&fake_provider_config(&broken, ""));
    let runnerd = Runnerd::start(&state);
    let events = runnerd
        .turn(&request("chat-broken", "run", "hi"))
        .finish(TURN);
    let last = events.last().unwrap();
    assert_eq!(last["code"], "cli_failed", "{events:#?}");
    let message = last["message"].as_str().unwrap();
    assert!(message.contains("the config is broken"), "{message}");
    drop(runnerd);

    // Mid-turn: the thread started, then the CLI died.
    let midway = fake_cli(
        &state,
        "midway",
        r#"echo '{"type":"thread.started","thread_id":"t-1"}'
echo '{"type":"turn.started"}'
kill -9 $$"#,
    );
    state.set_config(&fake_provider_config(&midway, ""));
    let runnerd = Runnerd::start(&state);
    let events = runnerd
        .turn(&request("chat-midway", "run", "hi"))
        .finish(TURN);
    assert_eq!(of_type(&events, "session")[0]["session_id"], "t-1");
    let last = events.last().unwrap();
    assert_eq!(last["code"], "cli_failed", "{events:#?}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("before the turn ended"),
        "{last}"
    );
}

#[test]
fn a_turn_past_its_timeout_ends_with_its_whole_tree() {
    let state = StateRoot::new();
    state.project("p", &[("hello.txt", "hi")]);
    let slow = fake_cli(
        &state,
        "slow",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t-slow\"}'\nsleep 600 &\nsleep 601",
    );
    state.set_config(&fake_provider_config(&slow, "turn_timeout_secs = 2"));
    let runnerd = Runnerd::start(&state);
    let started = std::time::Instant::now();
    let events = runnerd
        .turn(&request("chat-slow", "run", "hi"))
        .finish(TURN);
    let last = events.last().unwrap();
    assert_eq!(last["code"], "turn_timeout", "{events:#?}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("turn_timeout_secs"),
        "{last}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    wait_until(
        "the slow CLI's processes are gone",
        Duration::from_secs(3),
        || processes_with(&slow).is_empty() && processes_with("sleep 601").is_empty(),
    );
    assert_eq!(runnerd.get("/v1/health")["status"], "ok");
}

#[test]
fn a_project_folder_replaced_during_the_turn_is_refused() {
    let state = StateRoot::new();
    let project = state.project("p", &[("hello.txt", "hi")]);
    let waits = fake_cli(
        &state,
        "waits",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t-w\"}'\nwhile [ ! -e go ]; do sleep 0.1; done\ncat project/hello.txt >&2\necho '{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}'",
    );
    state.set_config(&fake_provider_config(&waits, ""));
    let runnerd = Runnerd::start(&state);
    let turn = runnerd.turn(&request("chat-swap", "run", "hi"));
    assert_eq!(turn.next(TURN)["type"], "started");
    // The folder is moved away and another put in its place while the CLI runs.
    std::fs::rename(&project, state.documents().join("p-moved")).unwrap();
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("hello.txt"), "impostor").unwrap();
    let runtimes = state.root().join("runner/runtimes");
    let runtime = std::fs::read_dir(&runtimes)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(runtime.join("go"), "").unwrap();
    let events = turn.finish(TURN);
    let last = events.last().unwrap();
    assert_eq!(last["code"], "project_unavailable", "{events:#?}");
    assert!(
        last["message"].as_str().unwrap().contains("replaced"),
        "{last}"
    );
}

#[test]
fn a_fork_bomb_hits_the_turns_limits_and_runnerd_survives() {
    // Its own user (no other test's processes count against its limit) in a cgroup delegated
    // to it, as systemd runs runnerd.
    let (uid, gid) = {
        let _lock = users_lock();
        ensure_user("awtest-runnerbomb", &[])
    };
    let cgroup = DelegatedCgroup::new(uid, gid);
    let state = StateRoot::new();
    state.project("p", &[("hello.txt", "hi")]);
    let bomb = fake_cli(
        &state,
        "bomb",
        "echo '{\"type\":\"thread.started\",\"thread_id\":\"t-bomb\"}'\nbomb() { bomb | bomb & }\nsleep 30 & s=$!\n(bomb) &\nwait $s",
    );
    state.set_config(&fake_provider_config(
        &bomb,
        "turn_timeout_secs = 4\nmax_processes = 64",
    ));
    state.give_state_to(uid, gid);
    let runnerd = Runnerd::start_as(&state, uid, gid, cgroup.path.clone());
    let before = tasks_of(uid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = std::thread::spawn({
        let (peak, sampling) = (peak.clone(), sampling.clone());
        move || {
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(tasks_of(uid), std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    let events = runnerd
        .turn(&request("chat-bomb", "run", "hi"))
        .finish(TURN);
    let ended_at = std::time::Instant::now();
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    sampler.join().unwrap();
    let last = events.last().unwrap();
    assert_eq!(last["code"], "turn_timeout", "{events:#?}");
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("fork bomb in a turn: tasks of its user before {before}, peak {peak} (limit +64)");
    // runnerd's own threads may grow by a few meanwhile.
    assert!(peak <= before + 64 + 16, "peak {peak}, before {before}");
    assert_eq!(runnerd.get("/v1/health")["status"], "ok");
    wait_until(
        "the bomb's processes are gone",
        Duration::from_secs(3),
        || processes_with(&bomb).is_empty(),
    );
    eprintln!("gone {:?} after the turn's end", ended_at.elapsed());
}

/// Codex's shell tool with `tty: true` runs its command on a terminal of its own (a PTY the
/// sandbox lets it make in a devpts instance private to the turn): `tty` names a `/dev/pts`
/// device, and the command runs to its end. runnerd runs as its own user, as systemd runs it
/// (that user maps itself into the namespace that holds the terminals). Run as root without
/// capabilities instead (as the other tests here run it), runnerd cannot map uid 0 into a user
/// namespace (Linux 5.12+ wants CAP_SETFCAP for that): the command gets no terminal at all, and
/// the turn goes on.
#[test]
fn a_command_asked_to_run_on_a_terminal_gets_one() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let script = || {
        vec![
            Reply::FunctionCall {
                name: "exec_command".into(),
                call_id: "c1".into(),
                arguments: json!({"cmd": "tty; echo ok-$((6*7))", "tty": true}),
            },
            Reply::Text("Done.".into()),
        ]
    };
    let model = runtime
        .block_on(ScriptedResponses::start(script()))
        .unwrap();
    let (uid, gid) = {
        let _lock = users_lock();
        ensure_user("awtest-runnertty", &[])
    };
    let cgroup = DelegatedCgroup::new(uid, gid);
    let s = setup(&model, "");
    std::os::unix::fs::chown(s.state.root().join("provider.key"), Some(uid), Some(gid)).unwrap();
    s.state.give_state_to(uid, gid);
    let runnerd = Runnerd::start_as(&s.state, uid, gid, cgroup.path.clone());
    let events = runnerd
        .turn(&request("chat-tty", "run", "Which terminal?"))
        .finish(TURN);
    ended(&events);
    let output = output_of(&events, "tty; echo ok");
    assert!(output.contains("/dev/pts/"), "{output:?}: {events:#?}");
    assert!(output.contains("ok-42"), "{output:?}: {events:#?}");
    assert!(!output.contains("not a tty"), "{output:?}");
    drop(runnerd);

    let model = runtime
        .block_on(ScriptedResponses::start(script()))
        .unwrap();
    let s = setup(&model, "");
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-tty", "run", "Which terminal?"))
        .finish(TURN);
    ended(&events);
    let output = output_of(&events, "tty; echo ok");
    assert!(!output.contains("/dev/pts/"), "{output:?}");
    assert!(output.contains("openpty"), "{output:?}");
}
