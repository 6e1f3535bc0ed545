//! The real Claude Code (`tests/claude`, pinned) run by the real runnerd, against a scripted
//! Messages API server on loopback, through runnerd's socket as agentd calls it: a Run turn reads
//! the project through `project/` with Claude Code's own `Bash` and cannot write it; a Builder
//! turn writes within its grants; a second turn resumes the session with its history; Stop ends
//! the CLI's tree and its capability; the gateway counts the usage; the operator's key reaches
//! the upstream as `x-api-key` and nothing in the sandbox, and the turn's capability stays out
//! of the commands Claude Code runs. Through the bridge (`agentworks-mcpbridge`, which Claude
//! Code spawns from its generated `mcp.json`): `mcp__bridge__execute_shell_command` runs in a
//! fresh sandbox of the turn's mode with the project as cwd, and
//! `mcp__bridge__diff_patch_workspace_file` reaches this test (as agentd) as a `bridge_call`
//! whose answer reaches the model. An upstream that refuses the operator's key ends the turn
//! promptly with `upstream_refused`, naming where the key comes from.

use super::harness::*;
use super::runner_support::RecordedRequest;
use super::runner_support::claude_binary;
use super::runner_support::messages::{Reply, ScriptedMessages, USAGE_PER_REPLY};
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const TURN: Duration = Duration::from_secs(90);

/// A state root with project `p`, the operator's key in a file, and a `claude` provider whose
/// upstream is `model`.
struct Setup {
    state: StateRoot,
    key: String,
}

fn setup(model: &ScriptedMessages) -> Setup {
    let state = StateRoot::new();
    let key = format!(
        "sk-ant-operator-{}",
        hex::encode(rand::random::<[u8; 16]>())
    );
    state.project(
        "p",
        &[
            ("hello.txt", "hello from the project\n"),
            ("workflow.json", "{}\n"),
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
        "[runnerd]\nmax_processes = 256\n[runnerd.providers.claude]\ndriver = \"claude\"\nexecutable = \"{}\"\nmodel = \"scripted-claude\"\nupstream = \"{}\"\nkey_file = \"{}\"\n",
        claude_binary().display(),
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
        "provider": "claude",
        "mode": mode,
        "guard": {"write_paths": [""], "blocked_paths": []},
        "prompt": prompt,
    })
}

fn texts(events: &[Value]) -> String {
    of_type(events, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect()
}

#[test]
fn a_run_turn_reads_the_project_and_cannot_write_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![
            Reply::bash("t1", "cat project/hello.txt"),
            Reply::bash("t2", "echo new > project/new.txt; echo rc=$?"),
            Reply::bash("t3", "echo changed >> project/hello.txt; echo rc=$?"),
            Reply::Text("The project says hello.".into()),
        ]))
        .unwrap();
    let s = setup(&model);
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-run", "run", "What does hello.txt say?"))
        .finish(TURN);
    ended(&events);
    assert_eq!(events[0]["type"], "started");
    let session = of_type(&events, "session");
    assert_eq!(session.len(), 1, "{events:#?}");
    assert!(output_of(&events, "cat project/hello.txt").contains("hello from the project"));
    assert!(
        output_of(&events, "project/new.txt").contains("rc=1"),
        "{events:#?}"
    );
    assert!(output_of(&events, ">> project/hello.txt").contains("rc=1"));
    assert!(texts(&events).contains("The project says hello."));
    // The gateway counted every model request of the turn (its usage, not Claude Code's).
    let usage = of_type(&events, "usage");
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!(usage[0]["input_tokens"], 4 * USAGE_PER_REPLY.0, "{usage:?}");
    assert_eq!(
        usage[0]["output_tokens"],
        4 * USAGE_PER_REPLY.1,
        "{usage:?}"
    );
    let project = s.state.documents().join("p");
    assert!(!project.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(project.join("hello.txt")).unwrap(),
        "hello from the project\n"
    );
    // The upstream got the operator's key as x-api-key; nothing else went upstream.
    let requests = model.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
    for r in &requests {
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/messages")
        );
        assert_eq!(r.header("x-api-key"), Some(s.key.as_str()));
        assert_eq!(r.body["model"], "scripted-claude");
    }
}

#[test]
fn a_builder_turn_writes_within_its_grants() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![
            Reply::bash("t1", "echo made > project/docs/new.md; echo rc=$?"),
            Reply::bash("t2", "echo '{\"x\":1}' > project/workflow.json; echo rc=$?"),
            Reply::Text("done".into()),
        ]))
        .unwrap();
    let s = setup(&model);
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
    // A protected file stays out of reach in Builder mode too.
    assert!(
        output_of(&events, "workflow.json").contains("rc=1"),
        "{events:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("workflow.json")).unwrap(),
        "{}\n"
    );
}

#[test]
fn a_second_turn_resumes_the_session_with_its_history() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![
            Reply::Text("first answer".into()),
            Reply::Text("second answer".into()),
        ]))
        .unwrap();
    let s = setup(&model);
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
    assert!(texts(&second).contains("second answer"));
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let history = requests[1].body["messages"].to_string();
    assert!(history.contains("tangerine"), "{history}");
    assert!(history.contains("first answer"), "{history}");
    assert!(history.contains("which word?"), "{history}");
    // The first request had none of it.
    assert!(
        !requests[0].body["messages"]
            .to_string()
            .contains("first answer")
    );
}

/// The Claude Code processes of the turns on `state` (others run beside them in parallel tests),
/// each with its pid, its `ANTHROPIC_API_KEY` and its `ANTHROPIC_BASE_URL`, read as root from
/// outside.
fn claude_processes(state: &StateRoot) -> Vec<(String, String, String)> {
    let claude = claude_binary().display().to_string();
    let config_dir = format!("CLAUDE_CONFIG_DIR={}", state.root().display());
    let mut found = Vec::new();
    for process in processes_with(&claude) {
        let pid = process.split(':').next().unwrap().to_owned();
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if !vars.iter().any(|v| v.starts_with(&config_dir)) {
            continue;
        }
        let var = |name: &str| {
            vars.iter()
                .find_map(|v| v.strip_prefix(&format!("{name}=")).map(str::to_owned))
        };
        if let (Some(capability), Some(base_url)) =
            (var("ANTHROPIC_API_KEY"), var("ANTHROPIC_BASE_URL"))
        {
            found.push((pid, capability, base_url));
        }
    }
    found
}

/// The status of a Messages request to the gateway with `capability` as its `x-api-key`.
fn gateway_status(base_url: &str, capability: &str) -> u16 {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", &format!("x-api-key: {capability}")])
        .args(["-H", "content-type: application/json", "-d", "{}"])
        .arg(format!("{base_url}/v1/messages"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn stop_ends_the_clis_whole_tree_and_its_capability() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![Reply::bash(
            "t1",
            "sleep 297 & sleep 298",
        )]))
        .unwrap();
    let s = setup(&model);
    let runnerd = Runnerd::start(&s.state);
    let turn = runnerd.turn(&request("chat-stop", "run", "wait"));
    let started = turn.next(TURN);
    let turn_id = started["turn_id"].as_str().unwrap().to_owned();
    loop {
        if turn.next(TURN)["type"] == "tool_call" {
            break;
        }
    }
    wait_until("the sleeps run", Duration::from_secs(20), || {
        !processes_with("sleep 298").is_empty() && !processes_with("sleep 297").is_empty()
    });
    // The turn's capability, read (as root, from outside) from the CLI's environment, works
    // now and is refused once the turn has ended.
    let claude = claude_processes(&s.state);
    let (pid, capability, base_url) = claude.first().expect("the turn's claude runs").clone();
    assert!(capability.starts_with("awcap_"), "{capability}");
    assert_ne!(gateway_status(&base_url, &capability), 401);
    let answer = runnerd.cancel(&turn_id);
    assert_eq!(answer["cancelled"], turn_id.as_str(), "{answer}");
    let events = turn.finish(Duration::from_secs(10));
    assert_eq!(events.last().unwrap()["code"], "cancelled", "{events:#?}");
    wait_until("the sleeps are gone", Duration::from_secs(3), || {
        processes_with("sleep 298").is_empty() && processes_with("sleep 297").is_empty()
    });
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(gateway_status(&base_url, &capability), 401);
    assert_eq!(runnerd.get("/v1/health")["status"], "ok");
}

#[test]
fn the_key_stays_out_of_the_sandbox_and_the_capability_out_of_commands() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![
            // The runtime is <state>/runner/runtimes/<key>/: the key file is three folders up.
            Reply::bash("t1", "cat ../../../provider.key; echo rc=$?"),
            Reply::bash("t2", "env; echo end"),
            Reply::Text("looked".into()),
        ]))
        .unwrap();
    let s = setup(&model);
    let root = s.state.root().to_owned();
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-probe", "builder", "probe"))
        .finish(TURN);
    ended(&events);
    let key_read = output_of(&events, "provider.key");
    assert!(
        key_read.contains("rc=1") && !key_read.contains(&s.key),
        "{key_read}"
    );
    let env = output_of(&events, "env; echo end");
    assert!(env.contains("CLAUDE_CONFIG_DIR="), "env ran: {env}");
    assert!(!env.contains(&s.key), "{env}");
    assert!(
        !env.contains("awcap_"),
        "a command saw the turn's capability: {env}"
    );
    // Nothing under the runtimes holds the key, after the turn either (Claude Code's sessions
    // and state files included).
    let key_part = &s.key[..24];
    let runtimes = root.join("runner/runtimes");
    let files = all_files(&runtimes);
    assert!(
        files.iter().any(|f| f.ends_with(".jsonl")),
        "Claude Code kept its session in the runtime: {files:?}"
    );
    for file in files {
        if let Ok(text) = std::fs::read(runtimes.join(&file)) {
            assert!(
                !String::from_utf8_lossy(&text).contains(key_part),
                "{file} holds the key"
            );
        }
    }
}

/// What the model got back for its call `id`: the `tool_result` block of a later request, its
/// text.
fn tool_result_for(requests: &[RecordedRequest], id: &str) -> String {
    requests
        .iter()
        .flat_map(|r| r.messages())
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|block| block["type"] == "tool_result" && block["tool_use_id"] == id)
        .map(|block| match &block["content"] {
            Value::String(text) => text.clone(),
            Value::Array(parts) => parts
                .iter()
                .map(|p| p["text"].as_str().unwrap_or_default())
                .collect(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| panic!("no tool_result for {id}: {requests:#?}"))
}

#[test]
fn the_bridge_runs_a_shell_command_in_a_sandbox_and_hands_a_patch_to_agentd() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let diff = "--- a/docs/readme.md\n+++ b/docs/readme.md\n@@ -1 +1 @@\n-docs\n+patched docs\n";
    let model = runtime
        .block_on(ScriptedMessages::start(vec![
            Reply::mcp(
                "bridge",
                "execute_shell_command",
                "b1",
                json!({"command": "pwd; cat hello.txt; echo made > docs/new.md; echo rc=$?; \
                    echo top > top.txt; echo rc=$?; cat secret/plans.txt; echo rc=$?; env"}),
            ),
            Reply::mcp(
                "bridge",
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "docs/readme.md", "diff": diff}),
            ),
            Reply::Text("bridged".into()),
        ]))
        .unwrap();
    let s = setup(&model);
    std::fs::create_dir_all(s.state.documents().join("p/secret")).unwrap();
    std::fs::write(s.state.documents().join("p/secret/plans.txt"), "blocked\n").unwrap();
    let runnerd = Runnerd::start(&s.state);
    let providers = runnerd.get("/v1/providers");
    assert!(providers.get("bridge_unavailable").is_none(), "{providers}");
    let mut builder = request("chat-bridge", "builder", "use the bridge");
    builder["guard"] = json!({"write_paths": ["docs"], "blocked_paths": ["secret"]});
    let turn = runnerd.turn(&builder);
    let turn_id = turn.next(TURN)["turn_id"].as_str().unwrap().to_owned();
    let mut events = Vec::new();
    let call = loop {
        let event = turn.next(TURN);
        assert!(
            !matches!(event["type"].as_str(), Some("end" | "error")),
            "the turn ended without a bridge call: {event} after {events:#?}"
        );
        if event["type"] == "bridge_call" {
            break event;
        }
        events.push(event);
    };
    // The shell command ran in runnerd (no bridge_call for it) before the patch was asked for.
    assert_eq!(call["tool"], "diff_patch_workspace_file");
    assert_eq!(call["arguments"]["filepath"], "docs/readme.md");
    assert_eq!(call["arguments"]["diff"], diff);
    let call_id = call["call_id"].as_str().unwrap().to_owned();
    let client = UnixClient::new(&runnerd.socket);
    let answer =
        json!({"ok": true, "result": {"receipt": "rcpt-claude-7", "path": "docs/readme.md"}});
    let answered: Value = runtime
        .block_on(client.post(&format!("/v1/turns/{turn_id}/bridge/{call_id}"), &answer))
        .unwrap();
    assert_eq!(answered["answered"], call_id.as_str());
    events.extend(turn.finish(TURN));
    ended(&events);

    let requests = model.requests();
    // Claude Code offered the bridge's tools under its MCP names.
    let offered = requests[0].tool_names();
    for tool in [
        "mcp__bridge__execute_shell_command",
        "mcp__bridge__diff_patch_workspace_file",
    ] {
        assert!(offered.iter().any(|t| t == tool), "{offered:?}");
    }
    let project = s.state.documents().join("p");
    // The bridge answers with the command's exit code, stdout and stderr as JSON.
    let shell: Value = serde_json::from_str(&tool_result_for(&requests, "b1")).unwrap();
    assert_eq!(shell["exit_code"], 0, "{shell}");
    let stdout = shell["stdout"].as_str().unwrap();
    let stderr = shell["stderr"].as_str().unwrap();
    // The cwd is the project's folder; Builder writes within its grants and nowhere else.
    assert!(
        stdout.starts_with(&format!("{}\n", project.display())),
        "{shell}"
    );
    assert!(stdout.contains("hello from the project"), "{shell}");
    let codes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("rc=")).collect();
    assert_eq!(codes, ["rc=0", "rc=2", "rc=1"], "{shell}");
    assert!(!stdout.contains("blocked"), "{shell}");
    assert!(
        stderr.contains("cannot create top.txt: Permission denied")
            && stderr.contains("secret/plans.txt: Permission denied"),
        "{shell}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("docs/new.md")).unwrap(),
        "made\n"
    );
    assert!(!project.join("top.txt").exists());
    // The command's environment has neither capability.
    assert!(stdout.contains("\nHOME="), "{shell}");
    for secret in ["awcap_", "awbr_", "AGENTWORKS_BRIDGE", s.key.as_str()] {
        assert!(!stdout.contains(secret), "a command saw {secret}: {shell}");
    }
    // agentd's answer reached the model; runnerd patched nothing itself.
    assert!(tool_result_for(&requests, "p1").contains("rcpt-claude-7"));
    assert_eq!(
        std::fs::read_to_string(project.join("docs/readme.md")).unwrap(),
        "docs\n"
    );
    // The stream shows both as the CLI's tool calls, with their results.
    let calls = of_type(&events, "tool_call");
    let tools: Vec<&str> = calls.iter().filter_map(|c| c["tool"].as_str()).collect();
    assert_eq!(
        tools,
        [
            "bridge.execute_shell_command",
            "bridge.diff_patch_workspace_file"
        ],
        "{events:#?}"
    );
    assert!(output_of(&events, "cat hello.txt").contains("rc=0"));
    assert!(texts(&events).contains("bridged"));
}

#[test]
fn an_upstream_that_refuses_the_key_ends_the_turn_promptly_with_upstream_refused() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedMessages::start(vec![Reply::RefuseKey]))
        .unwrap();
    let s = setup(&model);
    let runnerd = Runnerd::start(&s.state);
    let started = Instant::now();
    let events = runnerd
        .turn(&request("chat-refused", "run", "hi"))
        .finish(TURN);
    let took = started.elapsed();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error", "{events:#?}");
    assert_eq!(last["code"], "upstream_refused", "{events:#?}");
    let message = last["message"].as_str().unwrap();
    assert!(
        message.contains("key_file of [runnerd.providers.claude]") && message.contains("401"),
        "{message}"
    );
    assert!(!message.contains(&s.key), "{message}");
    // Claude Code's own message is not shown as the model's answer.
    assert!(texts(&events).is_empty(), "{events:#?}");
    // Two retries, not Claude Code's default ten with a backoff of minutes.
    assert_eq!(model.requests().len(), 3, "{:#?}", model.requests());
    assert!(took < Duration::from_secs(20), "the turn took {took:?}");
}
