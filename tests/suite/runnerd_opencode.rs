//! The real OpenCode (`tests/opencode`, pinned) run by the real runnerd through the ACP driver,
//! in runnerd's real sandbox, against a scripted chat-completions server on loopback, through
//! runnerd's socket as agentd calls it: a Run turn's own `bash` reads the project through
//! `project/` and cannot write it; a Builder turn writes within its grants but not a protected
//! or blocked file; the bridge's tools (`bridge_<tool>` in OpenCode) reach runnerd's endpoint
//! (a shell command in the turn's sandbox, a patch handed to agentd as a `bridge_call`); the
//! next turn loads the session (the model gets the first turn's history); Stop ends the
//! CLI's whole tree; the usage comes from the gateway; the operator's key reaches the upstream
//! and nothing in the sandbox, and OpenCode's commands see neither the turn's capability nor
//! the bridge's. Last, an OpenCode chat through the real agentd. (Bound to a laptop folder:
//! `suite::agent_cli_laptop`.)

use super::harness::*;
use super::runner_support::chat_completions::{
    RecordedRequest, Reply, ScriptedChat, USAGE_PER_REPLY,
};
use super::runner_support::opencode_binary;
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::time::Duration;

const TURN: Duration = Duration::from_secs(90);

struct Setup {
    state: StateRoot,
    key: String,
}

fn new_key() -> String {
    format!("sk-operator-{}", hex::encode(rand::random::<[u8; 16]>()))
}

/// The `[runnerd.providers.opencode]` of these tests (and of the README): the real OpenCode
/// through the ACP driver, its upstream `upstream`.
pub(super) fn opencode_provider(name: &str, upstream: &str, key_file: &std::path::Path) -> String {
    format!(
        "[runnerd.providers.{name}]\ndriver = \"acp\"\nexecutable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{upstream}\"\nkey_file = \"{}\"\n\n[runnerd.providers.{name}.acp]\nagent = \"opencode\"\nargs = [\"acp\"]\napi = \"chat_completions\"\n",
        opencode_binary().display(),
        key_file.display(),
    )
}

/// A state root with project `p`, the operator's key in a file, and an `opencode` provider
/// whose upstream is `model`.
fn setup(model: &ScriptedChat) -> Setup {
    setup_in(StateRoot::new(), new_key(), model)
}

fn setup_in(state: StateRoot, key: String, model: &ScriptedChat) -> Setup {
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
        "[runnerd]\nmax_processes = 256\n\n{}",
        opencode_provider("opencode", &model.base_url(), &key_file)
    ));
    Setup { state, key }
}

fn request(chat: &str, mode: &str, prompt: &str) -> Value {
    json!({
        "chat_id": chat,
        "user_id": "user-1",
        "project": "p",
        "provider": "opencode",
        "mode": mode,
        "guard": {"write_paths": ["docs"], "blocked_paths": ["secret"]},
        "prompt": prompt,
    })
}

/// OpenCode's own shell, as the scripted model calls it.
fn bash(call_id: &str, command: &str) -> Reply {
    Reply::tool(
        "bash",
        call_id,
        json!({"command": command, "description": "Runs a command"}),
    )
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The output of the tool result of call `call_id`.
fn output_of<'a>(events: &'a [Value], call_id: &str) -> &'a str {
    of_type(events, "tool_result")
        .into_iter()
        .find(|r| r["call_id"] == call_id)
        .and_then(|r| r["output"].as_str())
        .unwrap_or_else(|| panic!("no result for {call_id}: {events:#?}"))
}

/// What the model was told about its call `call_id` (the `tool` message of a later request).
fn told(requests: &[RecordedRequest], call_id: &str) -> String {
    requests
        .iter()
        .flat_map(|r| r.messages())
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .map(|m| m["content"].to_string())
        .unwrap_or_else(|| panic!("the model never got an answer for {call_id}: {requests:#?}"))
}

fn ended(events: &[Value]) {
    let last = events.last().unwrap();
    assert_eq!(last["type"], "end", "the turn failed: {events:#?}");
}

#[test]
fn a_run_turn_reads_the_project_and_cannot_write_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedChat::start(vec![
            bash("c1", "cat project/hello.txt"),
            bash("c2", "echo new > project/new.txt; echo rc=$?"),
            bash("c3", "echo changed >> project/hello.txt; echo rc=$?"),
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
    assert!(!of_type(&events, "session").is_empty(), "{events:#?}");
    assert!(
        output_of(&events, "c1").contains("hello from the project"),
        "{events:#?}"
    );
    let write = output_of(&events, "c2");
    assert!(write.contains("rc=") && !write.contains("rc=0"), "{write}");
    let append = output_of(&events, "c3");
    assert!(
        append.contains("rc=") && !append.contains("rc=0"),
        "{append}"
    );
    let texts: String = of_type(&events, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect();
    assert!(texts.contains("The project says hello."), "{texts:?}");
    // The gateway counted every model request of the turn.
    let usage = of_type(&events, "usage");
    assert_eq!(
        usage.last().unwrap()["input_tokens"],
        4 * USAGE_PER_REPLY.0,
        "{usage:?}"
    );
    let project = s.state.documents().join("p");
    assert!(!project.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(project.join("hello.txt")).unwrap(),
        "hello from the project\n"
    );
    // The upstream got the operator's key; OpenCode had only the turn's capability.
    let requests = model.requests();
    assert_eq!(requests.len(), 4, "{requests:#?}");
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
        .block_on(ScriptedChat::start(vec![
            bash("c1", "echo made > project/docs/new.md; echo rc=$?"),
            bash("c2", "echo outside > project/top.txt; echo rc=$?"),
            bash("c3", "echo '{\"x\":1}' > project/workflow.json; echo rc=$?"),
            bash("c4", "cat project/secret/plans.txt; echo rc=$?"),
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
    assert!(output_of(&events, "c1").contains("rc=0"), "{events:#?}");
    assert_eq!(
        std::fs::read_to_string(project.join("docs/new.md")).unwrap(),
        "made\n"
    );
    let outside = output_of(&events, "c2");
    assert!(
        outside.contains("rc=") && !outside.contains("rc=0"),
        "{outside}"
    );
    assert!(!project.join("top.txt").exists());
    let protected = output_of(&events, "c3");
    assert!(
        protected.contains("rc=") && !protected.contains("rc=0"),
        "{protected}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("workflow.json")).unwrap(),
        "{}\n"
    );
    let blocked = output_of(&events, "c4");
    assert!(
        blocked.contains("rc=") && !blocked.contains("rc=0") && !blocked.contains("blocked\n"),
        "{blocked}"
    );
}

/// The bridge's tools as OpenCode names them: `bridge_<tool>`.
fn bridge(call_id: &str, tool: &str, arguments: Value) -> Reply {
    Reply::tool(&format!("bridge_{tool}"), call_id, arguments)
}

#[test]
fn the_bridges_shell_runs_in_the_turns_sandbox_and_its_patch_goes_to_agentd() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let diff = "--- a/docs/readme.md\n+++ b/docs/readme.md\n@@ -1 +1 @@\n-docs\n+patched docs\n";
    let model = runtime
        .block_on(ScriptedChat::start(vec![
            bridge(
                "b1",
                "execute_shell_command",
                json!({"command": "pwd; cat hello.txt; echo new > top.txt; echo rc=$?"}),
            ),
            bridge(
                "p1",
                "diff_patch_workspace_file",
                json!({"filepath": "docs/readme.md", "diff": diff}),
            ),
            // OpenCode's own shell: neither the bridge's capability nor the model's is there.
            bash("e1", "env; echo end"),
            Reply::Text("patched".into()),
        ]))
        .unwrap();
    let s = setup(&model);
    let runnerd = Runnerd::start(&s.state);
    let turn = runnerd.turn(&request("chat-bridge", "builder", "use the bridge"));
    let started = turn.next(TURN);
    let turn_id = started["turn_id"].as_str().unwrap().to_owned();
    let mut seen = vec![started];
    let call = loop {
        let event = turn.next(TURN);
        assert!(
            !matches!(event["type"].as_str(), Some("end" | "error")),
            "the turn ended without a bridge call: {event}: {seen:#?}"
        );
        if event["type"] == "bridge_call" {
            break event;
        }
        seen.push(event);
    };
    assert_eq!(call["tool"], "diff_patch_workspace_file");
    assert_eq!(call["arguments"]["filepath"], "docs/readme.md");
    assert_eq!(call["arguments"]["diff"], diff);
    let call_id = call["call_id"].as_str().unwrap().to_owned();
    let client = UnixClient::new(&runnerd.socket);
    let answer = json!({"ok": true, "result": {"receipt": "rcpt-42", "path": "docs/readme.md"}});
    let answered: Value = runtime
        .block_on(client.post(&format!("/v1/turns/{turn_id}/bridge/{call_id}"), &answer))
        .unwrap();
    assert_eq!(answered["answered"], call_id.as_str());
    let mut events = seen;
    events.extend(turn.finish(TURN));
    ended(&events);

    let requests = model.requests();
    // OpenCode offered the bridge's tools beside its own.
    let offered = requests[0].function_names();
    for tool in [
        "bridge_execute_shell_command",
        "bridge_diff_patch_workspace_file",
        "bash",
    ] {
        assert!(offered.iter().any(|t| t == tool), "{tool}: {offered:?}");
    }
    // The bridge's shell ran in runnerd's sandbox of the turn's mode (Builder, writable in
    // `docs` only), the project as cwd.
    let project = s.state.documents().join("p");
    let shell = told(&requests, "b1");
    assert!(shell.contains("hello from the project"), "{shell}");
    assert!(shell.contains(&project.display().to_string()), "{shell}");
    assert!(shell.contains("rc=2") && !shell.contains("rc=0"), "{shell}");
    assert!(!project.join("top.txt").exists());
    // agentd's answer to the patch reached the model; runnerd patched nothing itself.
    let patch = told(&requests, "p1");
    assert!(patch.contains("rcpt-42"), "{patch}");
    assert_eq!(
        std::fs::read_to_string(project.join("docs/readme.md")).unwrap(),
        "docs\n"
    );
    let env = told(&requests, "e1");
    assert!(env.contains("HOME=") && env.contains("end"), "{env}");
    for secret in [
        "awbr_",
        "AGENTWORKS_BRIDGE_TOKEN",
        "awcap_",
        "OPENCODE_SERVER_PASSWORD",
        &s.key,
    ] {
        assert!(
            !env.contains(secret),
            "OpenCode's shell saw {secret}: {env}"
        );
    }
    // The stream shows the bridge's calls as the CLI's tool calls.
    for tool in [
        "bridge.execute_shell_command",
        "bridge.diff_patch_workspace_file",
    ] {
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "tool_call" && e["tool"] == tool),
            "{tool}: {events:#?}"
        );
    }
}

#[test]
fn the_next_turn_loads_the_session_under_the_same_key_only() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedChat::start(vec![
            Reply::Text("first answer".into()),
            Reply::Text("second answer".into()),
            Reply::Text("third answer".into()),
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
    // Only this turn's text: the loaded session's replay is not an event.
    let texts: Vec<&str> = of_type(&second, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect();
    assert_eq!(texts, ["second answer"], "{second:#?}");
    let messages = serde_json::to_string(model.requests()[1].messages()).unwrap();
    assert!(messages.contains("tangerine"), "{messages}");
    assert!(messages.contains("first answer"), "{messages}");
    // Under another key (another chat's), the session is not loaded: a new one starts.
    let mut third = request("chat-resume", "run", "and now?");
    third["resume"] = json!({"session_id": session, "session_key": "0".repeat(64)});
    let third = runnerd.turn(&third).finish(TURN);
    ended(&third);
    assert_ne!(
        of_type(&third, "session")[0]["session_id"],
        session.as_str()
    );
    let messages = serde_json::to_string(model.requests()[2].messages()).unwrap();
    assert!(!messages.contains("tangerine"), "{messages}");
}

#[test]
fn stop_ends_the_clis_whole_tree() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedChat::start(vec![bash(
            "c1",
            "sleep 387 & sleep 388",
        )]))
        .unwrap();
    let s = setup(&model);
    let runnerd = Runnerd::start(&s.state);
    let turn = runnerd.turn(&request("chat-stop", "run", "wait"));
    let started = turn.next(TURN);
    let turn_id = started["turn_id"].as_str().unwrap().to_owned();
    wait_until("the sleeps run", Duration::from_secs(60), || {
        !processes_with("sleep 388").is_empty() && !processes_with("sleep 387").is_empty()
    });
    // The turn's capability, read (as root, from outside) from OpenCode's environment, works
    // now and is refused once the turn has ended.
    let (pid, capability) = opencode_processes(&s.state)
        .first()
        .expect("the turn's opencode runs")
        .clone();
    let gateway = gateway_url(&s.state);
    assert_ne!(gateway_status(&gateway, &capability), 401);
    let answer = runnerd.cancel(&turn_id);
    assert_eq!(answer["cancelled"], turn_id.as_str(), "{answer}");
    let events = turn.finish(Duration::from_secs(15));
    let last = events.last().unwrap();
    assert_eq!(last["code"], "cancelled", "{events:#?}");
    wait_until("the sleeps are gone", Duration::from_secs(3), || {
        processes_with("sleep 388").is_empty() && processes_with("sleep 387").is_empty()
    });
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(gateway_status(&gateway, &capability), 401);
    assert_eq!(runnerd.get("/v1/health")["status"], "ok");
}

/// The OpenCode processes of the turns on `state`, each with its pid and its
/// `AGENTWORKS_MODEL_KEY`, read as root from outside.
fn opencode_processes(state: &StateRoot) -> Vec<(String, String)> {
    let opencode = opencode_binary().display().to_string();
    let runtimes = state.root().join("runner/runtimes").display().to_string();
    let mut found = Vec::new();
    for process in processes_with(&opencode) {
        let pid = process.split(':').next().unwrap().to_owned();
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if !vars
            .iter()
            .any(|v| v.starts_with("HOME=") && v[5..].starts_with(&runtimes))
        {
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

/// The model gateway's base URL, from a runtime's generated `opencode.json`.
fn gateway_url(state: &StateRoot) -> String {
    let runtimes = state.root().join("runner/runtimes");
    for entry in std::fs::read_dir(&runtimes).unwrap().flatten() {
        let path = entry.path().join("home/.config/opencode/opencode.json");
        if let Ok(config) = std::fs::read_to_string(path) {
            let config: Value = serde_json::from_str(&config).unwrap();
            return config["provider"]["agentworks"]["options"]["baseURL"]
                .as_str()
                .unwrap()
                .to_owned();
        }
    }
    panic!(
        "no runtime with an opencode.json under {}",
        runtimes.display()
    )
}

/// The status of a chat-completions request to the gateway with `capability` as the key.
fn gateway_status(base_url: &str, capability: &str) -> u16 {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", &format!("authorization: Bearer {capability}")])
        .args(["-H", "content-type: application/json", "-d", "{}"])
        .arg(format!("{base_url}/chat/completions"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn the_operators_key_is_in_no_environment_or_file_of_the_sandbox() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let state = StateRoot::new();
    // The probe looks for a piece of the key without naming it on its command line.
    let key = new_key();
    let key_part = key[..20].to_owned();
    let model = runtime
        .block_on(ScriptedChat::start(vec![
            bash(
                "c1",
                &format!(
                    "cat {}/provider.key; echo rc=$?; env; grep -rlsF \"$(echo {} | base64 -d)\" . /proc/self/environ /tmp 2>/dev/null | head -3; echo end",
                    state.root().display(),
                    base64_of(&key_part)
                ),
            ),
            Reply::Text("looked".into()),
        ]))
        .unwrap();
    let s = setup_in(state, key, &model);
    let runnerd = Runnerd::start(&s.state);
    let events = runnerd
        .turn(&request("chat-probe", "builder", "probe"))
        .finish(TURN);
    ended(&events);
    let out = output_of(&events, "c1");
    assert!(out.contains("HOME=") && out.contains("end"), "{out}");
    assert!(out.contains("rc=1") && !out.contains(&s.key), "{out}");
    assert!(!out.contains(&key_part), "{out}");
    // Nothing under the runtime holds the key, after the turn either.
    let runtimes = s.state.root().join("runner/runtimes");
    for file in all_files(&runtimes) {
        if let Ok(text) = std::fs::read(runtimes.join(&file)) {
            assert!(
                !String::from_utf8_lossy(&text).contains(&key_part),
                "{file} holds the key"
            );
        }
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// The real OpenCode through the real runnerd, from agentd's chat API: its own shell's call
/// and result folded into the turn, the answer and the usage stored, and the second turn loads
/// the session (the model gets the first turn's conversation).
#[test]
fn an_opencode_chat_runs_its_turns_through_agentd_and_loads_its_session() {
    use super::agent::{api, code_project, of_kind, turn, user};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedChat::start(vec![
            bash("c1", "cat project/a.txt"),
            Reply::Text("The file says alpha.".into()),
            Reply::Text("Still alpha.".into()),
        ]))
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("provider.key");
    std::fs::write(&key_file, "sk-test-operator-key\n").unwrap();
    let (stack, _runnerd) = Stack::start_with_runnerd(&format!(
        "[runnerd]\nmax_processes = 256\n\n{}",
        opencode_provider("opencode", &model.base_url(), &key_file)
    ));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "alpha\n")]);
    let (status, agents) = api(&stack, &alice, "GET", "/v1/agents", Value::Null);
    assert_eq!(status, 200, "{agents}");
    let offered = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "opencode")
        .unwrap_or_else(|| panic!("opencode is not offered: {agents}"))
        .clone();
    assert_eq!(
        (&offered["driver"], &offered["available"]),
        (&json!("acp"), &json!(true)),
        "{offered}"
    );
    let (status, chat) = api(
        &stack,
        &alice,
        "POST",
        "/v1/chats",
        json!({"project": "app", "agent": "opencode"}),
    );
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();

    let events = turn(stack.port, &alice, &chat, "What does a.txt say?").unwrap();
    let end = &of_kind(&events, "end")[0];
    assert_eq!(end["reason"], "completed", "{events:#?}");
    let call = &of_kind(&events, "tool_call")[0];
    assert_eq!(call["name"], "bash", "{events:#?}");
    assert_eq!(call["arguments"]["command"], "cat project/a.txt");
    let result = &of_kind(&events, "tool_result")[0];
    assert_eq!(
        (&result["id"], &result["state"]),
        (&call["id"], &json!("done")),
        "{result}"
    );
    assert!(
        result["result"]["output"]
            .as_str()
            .unwrap()
            .contains("alpha"),
        "{result}"
    );
    let text: String = of_kind(&events, "text")
        .iter()
        .map(|t| t["text"].as_str().unwrap())
        .collect();
    assert!(text.contains("The file says alpha."), "{events:#?}");
    let (_, got) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(
        got["usage"]["turns"][0]["prompt_tokens"].as_u64(),
        Some(2 * USAGE_PER_REPLY.0),
        "{got}"
    );

    let events = turn(stack.port, &alice, &chat, "And now?").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let last = serde_json::to_string(requests[2].messages()).unwrap();
    assert!(last.contains("What does a.txt say?"), "{last}");
    assert!(last.contains("The file says alpha."), "{last}");
    assert!(last.contains("And now?"), "{last}");
    let (_, got) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    let per_turn = got["usage"]["turns"].as_array().unwrap();
    assert_eq!(per_turn.len(), 2, "{got}");
    assert_eq!(
        per_turn[1]["prompt_tokens"].as_u64(),
        Some(USAGE_PER_REPLY.0),
        "{got}"
    );
}
