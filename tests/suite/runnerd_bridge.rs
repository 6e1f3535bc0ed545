//! The bridge through the real Codex (`tests/codex`, pinned) and the real runnerd: Codex spawns
//! `agentworks-mcpbridge` (found beside runnerd) from its generated config, the scripted model
//! calls its tools in the namespace `mcp__bridge`, and the calls reach runnerd's loopback bridge
//! endpoint: `execute_shell_command` runs in a fresh sandbox of the turn's mode with the project
//! as cwd (Run reads and cannot write; Builder writes within its grants only);
//! `diff_patch_workspace_file` becomes a `bridge_call` event on runnerd's stream, this test
//! answers it as agentd would, and the answer reaches the model; the turn's bridge capability
//! works during the turn and is refused (401) once it ended.

use super::harness::*;
use super::runner_support::codex_binary;
use super::runner_support::responses::{RecordedRequest, Reply, ScriptedResponses};
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::time::Duration;

const TURN: Duration = Duration::from_secs(60);

/// A state root with project `p` and a `codex` provider whose upstream is `model`.
fn setup(model: &ScriptedResponses) -> StateRoot {
    let state = StateRoot::new();
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
    std::fs::write(&key_file, "sk-operator-bridge\n").unwrap();
    state.set_config(&format!(
        "[runnerd]\nmax_processes = 256\n[runnerd.providers.codex]\ndriver = \"codex\"\nexecutable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{}\"\nkey_file = \"{}\"\n",
        codex_binary().display(),
        model.base_url(),
        key_file.display()
    ));
    state
}

fn request(chat: &str, mode: &str) -> Value {
    json!({
        "chat_id": chat,
        "user_id": "user-1",
        "project": "p",
        "provider": "codex",
        "mode": mode,
        "guard": {"write_paths": ["docs"], "blocked_paths": ["secret"]},
        "prompt": "use the bridge",
    })
}

fn bridge(call_id: &str, tool: &str, arguments: Value) -> Reply {
    Reply::McpCall {
        server: "bridge".into(),
        tool: tool.into(),
        call_id: call_id.into(),
        arguments,
    }
}

fn shell(call_id: &str, command: &str) -> Reply {
    bridge(
        call_id,
        "execute_shell_command",
        json!({"command": command}),
    )
}

/// What the model got back for its call `call_id` (the `function_call_output` item of a later
/// request), as text.
fn output_for(requests: &[RecordedRequest], call_id: &str) -> String {
    requests
        .iter()
        .flat_map(|r| r.input())
        .find(|item| item["type"] == "function_call_output" && item["call_id"] == call_id)
        .map(|item| match &item["output"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| panic!("no output for {call_id}: {requests:#?}"))
}

#[test]
fn run_mode_bridge_shell_reads_the_project_and_cannot_write_it() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            shell("b1", "pwd; cat hello.txt"),
            shell(
                "b2",
                "echo new > new.txt; echo rc=$?; echo more >> hello.txt; echo rc=$?",
            ),
            shell("b3", "cat secret/plans.txt; echo rc=$?"),
            // Codex's own shell: the bridge's token and URL are not in its commands' env.
            Reply::FunctionCall {
                name: "exec_command".into(),
                call_id: "e1".into(),
                arguments: json!({"cmd": "env; echo end"}),
            },
            Reply::Text("read it".into()),
        ]))
        .unwrap();
    let state = setup(&model);
    let runnerd = Runnerd::start(&state);
    // The bridge was found beside runnerd.
    let providers = runnerd.get("/v1/providers");
    assert!(providers.get("bridge_unavailable").is_none(), "{providers}");
    let events = runnerd.turn(&request("chat-run", "run")).finish(TURN);
    ended(&events);
    let requests = model.requests();
    // Codex offers the bridge's tools in the namespace mcp__bridge.
    let namespace = requests[0]
        .tool("mcp__bridge")
        .unwrap_or_else(|| panic!("no mcp__bridge in {:?}", requests[0].tool_names()));
    let offered = namespace.to_string();
    assert!(
        offered.contains("execute_shell_command") && offered.contains("diff_patch_workspace_file"),
        "{offered}"
    );
    let project = state.documents().join("p");
    let read = output_for(&requests, "b1");
    assert!(read.contains("hello from the project"), "{read}");
    // The cwd is the project's folder.
    assert!(read.contains(&project.display().to_string()), "{read}");
    let write = output_for(&requests, "b2");
    assert!(
        !write.contains("rc=0"),
        "a Run-mode write succeeded: {write}"
    );
    // /bin/sh (dash) exits 2 for a redirection it cannot open.
    assert!(
        write.contains("rc=2") && write.contains("Permission denied"),
        "{write}"
    );
    assert!(!project.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(project.join("hello.txt")).unwrap(),
        "hello from the project\n"
    );
    let blocked = output_for(&requests, "b3");
    assert!(
        !blocked.contains("rc=0") && !blocked.contains("blocked\\n"),
        "{blocked}"
    );
    let env = output_for(&requests, "e1");
    assert!(env.contains("HOME=") && env.contains("end"), "{env}");
    assert!(
        !env.contains("AGENTWORKS_BRIDGE") && !env.contains("awbr_"),
        "a command saw the bridge's capability: {env}"
    );
    // The stream shows the bridge calls as the CLI's tool calls.
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "tool_call" && e["tool"] == "bridge.execute_shell_command"),
        "{events:#?}"
    );
    // Each command's scratch directory is gone.
    let scratch = state.root().join("runner/bridge");
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn builder_mode_bridge_shell_writes_within_its_grants_only() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            shell("b1", "echo made > docs/new.md; echo rc=$?"),
            shell("b2", "echo outside > top.txt; echo rc=$?"),
            shell("b3", "echo '{\"x\":1}' > workflow.json; echo rc=$?"),
            Reply::Text("built".into()),
        ]))
        .unwrap();
    let state = setup(&model);
    let runnerd = Runnerd::start(&state);
    let events = runnerd.turn(&request("chat-build", "builder")).finish(TURN);
    ended(&events);
    let requests = model.requests();
    let project = state.documents().join("p");
    let granted = output_for(&requests, "b1");
    assert!(granted.contains("rc=0"), "{granted}");
    assert_eq!(
        std::fs::read_to_string(project.join("docs/new.md")).unwrap(),
        "made\n"
    );
    let outside = output_for(&requests, "b2");
    assert!(
        outside.contains("rc=2") && outside.contains("Permission denied"),
        "{outside}"
    );
    assert!(!project.join("top.txt").exists());
    let protected = output_for(&requests, "b3");
    assert!(
        protected.contains("rc=2") && protected.contains("Permission denied"),
        "{protected}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("workflow.json")).unwrap(),
        "{}\n"
    );
}

/// The bridge's URL and capability, read (as root, from outside) from the environment of the
/// `agentworks-mcpbridge` process of the turn on `state`.
fn bridge_credentials(state: &StateRoot) -> Option<(String, String)> {
    let runtimes = state.root().join("runner/runtimes").display().to_string();
    for process in processes_with("agentworks-mcpbridge") {
        let pid = process.split(':').next().unwrap();
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else {
            continue;
        };
        if !cwd.display().to_string().starts_with(&runtimes) {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = environ
            .split(|b| *b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        let find = |name: &str| {
            vars.iter()
                .find_map(|v| v.strip_prefix(&format!("{name}=")).map(str::to_owned))
        };
        if let (Some(url), Some(token)) = (
            find("AGENTWORKS_BRIDGE_URL"),
            find("AGENTWORKS_BRIDGE_TOKEN"),
        ) {
            return Some((url, token));
        }
    }
    None
}

/// The HTTP status of `method` on `<url>/call` with `token` as the bearer token.
fn bridge_status(url: &str, token: &str, method: &str) -> u16 {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method])
        .args(["-H", &format!("authorization: Bearer {token}")])
        .args(["-H", "content-type: application/json"])
        .args([
            "-d",
            r#"{"tool":"execute_shell_command","arguments":{"command":"true"}}"#,
        ])
        .arg(format!("{url}/call"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_patch_goes_to_agentd_and_its_answer_reaches_the_model_and_the_token_ends_with_the_turn() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let diff = "--- a/docs/readme.md\n+++ b/docs/readme.md\n@@ -1 +1 @@\n-docs\n+patched docs\n";
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            bridge(
                "p1",
                "diff_patch_workspace_file",
                json!({"filepath": "docs/readme.md", "diff": diff}),
            ),
            Reply::Text("patched".into()),
        ]))
        .unwrap();
    let state = setup(&model);
    let runnerd = Runnerd::start(&state);
    let turn = runnerd.turn(&request("chat-patch", "builder"));
    let started = turn.next(TURN);
    let turn_id = started["turn_id"].as_str().unwrap().to_owned();
    let call = loop {
        let event = turn.next(TURN);
        assert!(
            !matches!(event["type"].as_str(), Some("end" | "error")),
            "the turn ended without a bridge call: {event}"
        );
        if event["type"] == "bridge_call" {
            break event;
        }
    };
    assert_eq!(call["tool"], "diff_patch_workspace_file");
    assert_eq!(call["arguments"]["filepath"], "docs/readme.md");
    assert_eq!(call["arguments"]["diff"], diff);
    let call_id = call["call_id"].as_str().unwrap().to_owned();

    // While the turn runs, its bridge capability is good (a GET is refused for its method, not
    // its token) and any other token is not.
    let (url, token) = bridge_credentials(&state).expect("the turn's bridge runs");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(bridge_status(&url, &token, "GET"), 405);
    assert_eq!(bridge_status(&url, "awbr_not-a-turn", "POST"), 401);

    // agentd's answer: to another turn, or to an unknown call, it is refused.
    let client = UnixClient::new(&runnerd.socket);
    let answer = json!({"ok": true, "result": {"receipt": "rcpt-42", "path": "docs/readme.md"}});
    let wrong_turn: Result<Value, _> =
        runtime.block_on(client.post(&format!("/v1/turns/turn_other/bridge/{call_id}"), &answer));
    assert!(wrong_turn.is_err(), "{wrong_turn:?}");
    let answered: Value = runtime
        .block_on(client.post(&format!("/v1/turns/{turn_id}/bridge/{call_id}"), &answer))
        .unwrap();
    assert_eq!(answered["answered"], call_id.as_str());
    let again: Result<Value, _> =
        runtime.block_on(client.post(&format!("/v1/turns/{turn_id}/bridge/{call_id}"), &answer));
    assert!(again.is_err(), "answered twice: {again:?}");

    let events = turn.finish(TURN);
    ended(&events);
    let output = output_for(&model.requests(), "p1");
    assert!(output.contains("rcpt-42"), "{output}");
    // runnerd did not patch anything itself: agentd (here, nobody) does.
    assert_eq!(
        std::fs::read_to_string(state.documents().join("p/docs/readme.md")).unwrap(),
        "docs\n"
    );
    // The turn ended: its bridge capability is refused.
    assert_eq!(bridge_status(&url, &token, "POST"), 401);
    assert_eq!(bridge_status(&url, &token, "GET"), 401);
}
