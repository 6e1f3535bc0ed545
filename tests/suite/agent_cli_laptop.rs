//! A coding CLI's chat bound to a laptop folder (issue 46): the real CLI runs on the server,
//! in runnerd's sandbox with no project at all and its native shell and file tools off; its
//! hands are the bridge's tools, which agentd sends to the real executor on the person's
//! laptop through the real gatewayd, as it sends the model loop's.
//!
//! With Codex against the scripted Responses server: the model asks Codex's own shell (it is
//! not there: the call fails and nothing runs), then the bridge's shell and patch (both happen
//! in the laptop folder, with the laptop's receipts under agentd's request ids; nothing changes
//! on the server). With the device offline the calls fail with `device_offline` and nothing
//! falls back to the server. A folder shared read-only gets no patch tool.
//!
//! In cluster mode (`AGENTWORKS_TEST_CLUSTER=1`) agentd reaches runnerd over NATS only.

use super::agent::{LaptopExt, Setup, api, of_kind, turn};
use super::agent_cli::runnerd_config;
use super::harness::*;
use super::runner_support::responses::{RecordedRequest, Reply, ScriptedResponses};
use serde_json::{Value, json};
use std::path::Path;

const PATCH: &str = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";

/// A bridge tool's call, as the scripted model makes it for Codex.
fn bridge(tool: &str, call_id: &str, arguments: Value) -> Reply {
    Reply::McpCall {
        server: "bridge".into(),
        tool: tool.into(),
        call_id: call_id.into(),
        arguments,
    }
}

/// Everything real, plus runnerd with the `codex` provider against `model`: alice's Codex chat
/// on `app`, bound to her laptop's `repo`.
struct CliSetup {
    setup: Setup,
    _runnerd: Runnerd,
    _keys: tempfile::TempDir,
    chat: String,
}

fn start(model: &ScriptedResponses) -> CliSetup {
    let keys = tempfile::tempdir().unwrap();
    let setup = Setup::start_with(true, &runnerd_config(keys.path(), &model.base_url()));
    let mut runnerd = Runnerd::start(&setup.stack.state);
    if cluster_mode() {
        // The stack reaches runnerd over NATS (Stack::start_with_gateway_and): only that way.
        runnerd.only_over_nats();
    }
    let (status, chat) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        "/v1/chats",
        json!({"project": "app", "agent": "codex", "mode": "builder"}),
    );
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();
    let (status, bound) = setup.bind(&chat);
    assert_eq!(status, 200, "a CLI chat binds like any chat: {bound}");
    CliSetup {
        setup,
        _runnerd: runnerd,
        _keys: keys,
        chat,
    }
}

/// The bridge tools Codex offered the model in `request` (its `mcp__bridge` namespace).
fn bridge_tools(request: &RecordedRequest) -> Vec<String> {
    let namespace = request
        .tool("mcp__bridge")
        .unwrap_or_else(|| panic!("no mcp__bridge in {:?}", request.tool_names()));
    namespace["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// What the model was told about call `call_id` (its `function_call_output`), as text.
fn output_of(requests: &[RecordedRequest], call_id: &str) -> String {
    requests
        .iter()
        .flat_map(|r| r.input().iter())
        .find(|item| item["call_id"] == call_id && item["type"] != "function_call")
        .map(|item| item["output"].to_string())
        .unwrap_or_else(|| panic!("the model never got an answer for {call_id}"))
}

/// Every file named `name` below `root`.
fn find_named(root: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if entry.file_name() == name {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn a_bound_codex_chat_runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            // Codex's own shell, asked for directly: switched off in a bound chat.
            Reply::exec_command("n1", "echo native > native-shell.txt"),
            bridge(
                "execute_shell_command",
                "s1",
                json!({"command": "cat a.txt; echo from-cli > made.txt; pwd"}),
            ),
            bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "a.txt", "diff": PATCH}),
            ),
            Reply::Text("Patched a.txt on the laptop.".into()),
        ]))
        .unwrap();
    let cli = start(&model);
    let setup = &cli.setup;
    let events = turn(setup.stack.port, &setup.alice, &cli.chat, "Fix a.txt.").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );

    // Both bridge calls happened in the laptop folder; nothing changed on the server.
    let repo = setup.laptop.repo();
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("made.txt")).unwrap(),
        "from-cli\n"
    );
    let documents = setup.stack.state.documents();
    assert_eq!(
        std::fs::read_to_string(documents.join("app/server.txt")).unwrap(),
        "server file\n"
    );
    assert!(!documents.join("app/made.txt").exists());
    assert!(!documents.join("app/a.txt").exists());
    // The native shell ran nowhere: not in the runtime, not anywhere on the server.
    assert!(
        find_named(setup.stack.state.root(), "native-shell.txt").is_empty(),
        "Codex's own shell ran in a bound chat"
    );
    assert!(!repo.join("native-shell.txt").exists());
    // The runtime the CLI ran in has no `project` link: no project at all.
    let runtimes = setup.stack.state.root().join("runner/runtimes");
    let dirs: Vec<_> = std::fs::read_dir(&runtimes).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(std::fs::symlink_metadata(dirs[0].path().join("project")).is_err());

    // The turn shows both bridge calls done, under agentd's request ids, each with the
    // laptop's receipt.
    let results = of_kind(&events, "tool_result");
    // Each call shown once: agentd's dispatch, not also Codex's own report of it.
    let shown: Vec<&Value> = of_kind(&events, "tool_call")
        .into_iter()
        .map(|c| &c["name"])
        .collect();
    assert_eq!(
        shown,
        [
            &json!("execute_shell_command"),
            &json!("diff_patch_workspace_file")
        ],
        "{events:#?}"
    );
    for tool in ["execute_shell_command", "diff_patch_workspace_file"] {
        let call = of_kind(&events, "tool_call")
            .into_iter()
            .find(|c| c["name"] == tool)
            .unwrap_or_else(|| panic!("no {tool} call: {events:#?}"));
        let result = results
            .iter()
            .find(|r| r["id"] == call["id"])
            .unwrap_or_else(|| panic!("no result of {tool}: {events:#?}"));
        assert_eq!(result["state"], "done", "{result}");
    }
    // One laptop receipt per bridge call, done, under agentd's request id for the turn.
    let db = setup.laptop.state_home().join("agentworks/receipts.db");
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut statement = conn
        .prepare("SELECT request_id, state FROM receipts")
        .unwrap();
    let receipts: Vec<(String, String)> = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(receipts.len(), 2, "{receipts:?}");
    for (request_id, state) in &receipts {
        let prefix = format!("chat-{}-turn-1-bridge-", cli.chat);
        assert!(request_id.starts_with(&prefix), "{receipts:?}");
        assert_eq!(state, "done", "{receipts:?}");
    }

    // The model: the shell's output came back from the laptop; Codex's own shell was not
    // there (the model was told so), and the bridge offered both tools of a writable folder.
    let requests = model.requests();
    let s1 = output_of(&requests, "s1");
    assert!(s1.contains("one") && s1.contains("two"), "{s1}");
    assert!(
        s1.contains(repo.to_str().unwrap()),
        "pwd is the laptop folder: {s1}"
    );
    let n1 = output_of(&requests, "n1");
    assert!(!n1.contains("native"), "the native shell ran: {n1}");
    // Codex answers the model itself ("unsupported call: exec_command"), reporting nothing on
    // its event stream.
    assert!(n1.contains("unsupported call"), "{n1}");
    assert!(
        !requests[0].tool_names().iter().any(|t| t == "exec_command"),
        "{:?}",
        requests[0].tool_names()
    );
    let mut offered = bridge_tools(&requests[0]);
    offered.sort();
    assert_eq!(
        offered,
        ["diff_patch_workspace_file", "execute_shell_command"]
    );
    // The generated instructions say where the hands are.
    let instructions = requests[0].body.to_string();
    assert!(
        instructions.contains("a folder the person shared from their own computer"),
        "{instructions}"
    );
}

#[test]
fn a_bound_codex_chat_with_the_device_offline_fails_its_calls_and_never_touches_the_server() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            bridge(
                "execute_shell_command",
                "s1",
                json!({"command": "echo changed > server.txt"}),
            ),
            bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "server.txt",
                       "diff": "--- a/server.txt\n+++ b/server.txt\n@@ -1 +1 @@\n-server file\n+changed\n"}),
            ),
            Reply::Text("The laptop is offline.".into()),
        ]))
        .unwrap();
    let mut cli = start(&model);
    cli.setup.executor.as_mut().unwrap().child.kill().unwrap();
    let _ = cli.setup.executor.as_mut().unwrap().child.wait();
    cli.setup.wait_device(false);
    let setup = &cli.setup;
    let events = turn(
        setup.stack.port,
        &setup.alice,
        &cli.chat,
        "Change server.txt.",
    )
    .unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    for id in ["s1", "p1"] {
        let output = output_of(&requests, id);
        assert!(output.contains("device_offline"), "{id}: {output}");
    }
    let failed: Vec<&Value> = of_kind(&events, "tool_result")
        .into_iter()
        .filter(|r| r["state"] == "failed")
        .collect();
    assert!(failed.len() >= 2, "{events:#?}");
    assert_eq!(
        std::fs::read_to_string(setup.stack.state.documents().join("app/server.txt")).unwrap(),
        "server file\n"
    );
}

#[test]
fn a_bound_codex_chat_on_a_read_only_folder_has_no_patch_tool() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "a.txt", "diff": PATCH}),
            ),
            Reply::Text("No patch tool here.".into()),
        ]))
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let mut setup = Setup::start_with(true, &runnerd_config(keys.path(), &model.base_url()));
    let _runnerd = Runnerd::start(&setup.stack.state);
    // The same folder, shared read-only this time.
    setup.executor = None;
    setup.wait_device(false);
    let repo = setup.laptop.repo();
    let child = setup
        .laptop
        .command(&[
            "executor",
            "connect",
            "--name",
            "laptop",
            "--folder",
            repo.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    setup.executor = Some(super::agent::Executor { child });
    let device = setup.wait_device(true);
    assert_eq!(device["folders"][0]["access"], "read_only", "{device}");
    let chat = create_chat_with(&setup, "codex");
    assert_eq!(setup.bind(&chat).0, 200);
    let events = turn(setup.stack.port, &setup.alice, &chat, "Patch a.txt.").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    assert_eq!(bridge_tools(&requests[0]), ["execute_shell_command"]);
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
}

fn create_chat_with(setup: &Setup, agent: &str) -> String {
    let (status, chat) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        "/v1/chats",
        json!({"project": "app", "agent": agent}),
    );
    assert_eq!(status, 201, "{chat}");
    chat["chat_id"].as_str().unwrap().to_owned()
}
