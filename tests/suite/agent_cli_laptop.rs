//! A coding CLI's chat bound to a laptop folder (issue 46): the real CLI runs on the server,
//! in runnerd's sandbox with no project at all and its native shell and file tools off; its
//! hands are the bridge's tools, which agentd sends to the real executor on the person's
//! laptop through the real gatewayd, as it sends the model loop's.
//!
//! Each scenario runs with each CLI against its scripted model: Codex (the Responses API; its
//! bridge tools in the namespace `mcp__bridge`), Claude Code (the Messages API;
//! `mcp__bridge__<tool>`) and OpenCode through the ACP driver (chat completions;
//! `bridge_<tool>`). The model asks the CLI's own shell directly: Codex does not have it (the
//! call fails and nothing runs); Claude Code (`--tools ""`) answers "no such tool" (the turn
//! shows the call failed) and nothing runs; OpenCode asks for permission, runnerd's policy
//! refuses it (the turn shows the call and the refusal) and nothing runs. Then the bridge's
//! shell and patch: both happen in the laptop folder, with the laptop's receipts under
//! agentd's request ids; nothing changes on the server. With the device offline the calls fail
//! with `device_offline` and nothing falls back to the server. A folder shared read-only gets
//! no patch tool.
//!
//! In cluster mode (`AGENTWORKS_TEST_CLUSTER=1`) agentd reaches runnerd over NATS only.

use super::agent::{LaptopExt, Setup, api, of_kind, turn};
use super::agent_cli::runnerd_config;
use super::harness::*;
use super::runner_support::{chat_completions, claude_binary, messages, responses};
use super::runnerd_opencode::opencode_provider;
use serde_json::{Value, json};
use std::path::Path;

const PATCH: &str = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";

/// The coding CLI of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cli {
    Codex,
    ClaudeCode,
    OpenCode,
}

/// One answer of the scripted model, whichever CLI it talks to.
enum Step {
    /// A call of the CLI's own shell.
    Native(&'static str, &'static str),
    /// A call of a bridge tool: tool, call id, arguments.
    Bridge(&'static str, &'static str, Value),
    Text(&'static str),
}

/// The scripted model of a CLI's dialect.
enum Model {
    Responses(responses::ScriptedResponses),
    Messages(messages::ScriptedMessages),
    Chat(chat_completions::ScriptedChat),
}

impl Cli {
    /// The provider's name, the chat's agent.
    fn agent(self) -> &'static str {
        match self {
            Cli::Codex => "codex",
            Cli::ClaudeCode => "claude",
            Cli::OpenCode => "opencode",
        }
    }

    fn model(self, runtime: &tokio::runtime::Runtime, steps: Vec<Step>) -> Model {
        match self {
            Cli::Codex => {
                use responses::Reply;
                let script = steps
                    .into_iter()
                    .map(|step| match step {
                        Step::Native(id, command) => Reply::exec_command(id, command),
                        Step::Bridge(tool, id, arguments) => Reply::McpCall {
                            server: "bridge".into(),
                            tool: tool.into(),
                            call_id: id.into(),
                            arguments,
                        },
                        Step::Text(text) => Reply::Text(text.into()),
                    })
                    .collect();
                Model::Responses(
                    runtime
                        .block_on(responses::ScriptedResponses::start(script))
                        .unwrap(),
                )
            }
            Cli::ClaudeCode => {
                use messages::Reply;
                let script = steps
                    .into_iter()
                    .map(|step| match step {
                        Step::Native(id, command) => Reply::bash(id, command),
                        Step::Bridge(tool, id, arguments) => {
                            Reply::mcp("bridge", tool, id, arguments)
                        }
                        Step::Text(text) => Reply::Text(text.into()),
                    })
                    .collect();
                Model::Messages(
                    runtime
                        .block_on(messages::ScriptedMessages::start(script))
                        .unwrap(),
                )
            }
            Cli::OpenCode => {
                use chat_completions::Reply;
                let script = steps
                    .into_iter()
                    .map(|step| match step {
                        Step::Native(id, command) => Reply::tool(
                            "bash",
                            id,
                            json!({"command": command, "description": "Runs a command"}),
                        ),
                        Step::Bridge(tool, id, arguments) => {
                            Reply::tool(&format!("bridge_{tool}"), id, arguments)
                        }
                        Step::Text(text) => Reply::Text(text.into()),
                    })
                    .collect();
                Model::Chat(
                    runtime
                        .block_on(chat_completions::ScriptedChat::start(script))
                        .unwrap(),
                )
            }
        }
    }

    /// runnerd's config: the `codex` and `ghost` providers of `suite::agent_cli`, Claude Code's
    /// and OpenCode's (the CLIs not under test get an upstream that answers nothing).
    fn config(self, keys: &Path, model: &Model) -> String {
        let nowhere = || "http://127.0.0.1:9/v1".to_owned();
        let upstream = |cli: Cli| {
            if cli == self {
                model.base_url()
            } else {
                nowhere()
            }
        };
        let key_file = keys.join("provider.key");
        format!(
            "{}\n{}\n[runnerd.providers.claude]\ndriver = \"claude\"\nexecutable = \"{}\"\n\
             model = \"scripted-claude\"\nupstream = \"{}\"\nkey_file = \"{}\"\n",
            runnerd_config(keys, &upstream(Cli::Codex)),
            opencode_provider("opencode", &upstream(Cli::OpenCode), &key_file),
            claude_binary().display(),
            upstream(Cli::ClaudeCode),
            key_file.display(),
        )
    }
}

impl Model {
    fn base_url(&self) -> String {
        match self {
            Model::Responses(model) => model.base_url(),
            Model::Messages(model) => model.base_url(),
            Model::Chat(model) => model.base_url(),
        }
    }

    /// What the model was told about its call `call_id`, as text.
    fn told(&self, call_id: &str) -> String {
        let found = match self {
            Model::Responses(model) => model
                .requests()
                .iter()
                .flat_map(|r| r.input().to_vec())
                .find(|item| item["call_id"] == call_id && item["type"] != "function_call")
                .map(|item| item["output"].to_string()),
            Model::Messages(model) => model
                .requests()
                .iter()
                .flat_map(|r| r.messages().to_vec())
                .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
                .find(|block| block["type"] == "tool_result" && block["tool_use_id"] == call_id)
                .map(|block| block["content"].to_string()),
            Model::Chat(model) => model
                .requests()
                .iter()
                .flat_map(|r| r.messages().to_vec())
                .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
                .map(|m| m["content"].to_string()),
        };
        found.unwrap_or_else(|| panic!("the model never got an answer for {call_id}"))
    }

    /// The bridge tools the CLI offered the model in its first request, sorted.
    fn bridge_tools(&self) -> Vec<String> {
        let mut tools: Vec<String> = match self {
            Model::Responses(model) => {
                let first = &model.requests()[0];
                let namespace = first
                    .tool("mcp__bridge")
                    .unwrap_or_else(|| panic!("no mcp__bridge in {:?}", first.tool_names()));
                namespace["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_owned())
                    .collect()
            }
            Model::Messages(model) => model.requests()[0]
                .tool_names()
                .into_iter()
                .filter_map(|name| name.strip_prefix("mcp__bridge__").map(str::to_owned))
                .collect(),
            Model::Chat(model) => model.requests()[0]
                .function_names()
                .into_iter()
                .filter_map(|name| name.strip_prefix("bridge_").map(str::to_owned))
                .collect(),
        };
        tools.sort();
        tools
    }

    /// The first request's whole body, as text.
    fn first_request(&self) -> String {
        match self {
            Model::Responses(model) => model.requests()[0].body.to_string(),
            Model::Messages(model) => model.requests()[0].body.to_string(),
            Model::Chat(model) => model.requests()[0].body.to_string(),
        }
    }
}

/// Everything real, plus runnerd with the providers of [`Cli::config`]: alice's chat of `cli`
/// on `app`, bound to her laptop's `repo`.
struct CliSetup {
    setup: Setup,
    _runnerd: Runnerd,
    _keys: tempfile::TempDir,
    chat: String,
}

fn start(cli: Cli, model: &Model) -> CliSetup {
    let keys = tempfile::tempdir().unwrap();
    let setup = Setup::start_with(true, &cli.config(keys.path(), model));
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
        json!({"project": "app", "agent": cli.agent(), "mode": "builder"}),
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

fn runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell(cli: Cli) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = cli.model(
        &runtime,
        vec![
            // The CLI's own shell, asked for directly: switched off in a bound chat.
            Step::Native("n1", "echo native > native-shell.txt"),
            Step::Bridge(
                "execute_shell_command",
                "s1",
                json!({"command": "cat a.txt; echo from-cli > made.txt; pwd"}),
            ),
            Step::Bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "a.txt", "diff": PATCH}),
            ),
            Step::Text("Patched a.txt on the laptop."),
        ],
    );
    let cli_setup = start(cli, &model);
    let setup = &cli_setup.setup;
    let events = turn(
        setup.stack.port,
        &setup.alice,
        &cli_setup.chat,
        "Fix a.txt.",
    )
    .unwrap();
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
        "{cli:?}'s own shell ran in a bound chat"
    );
    assert!(!repo.join("native-shell.txt").exists());
    // The runtime the CLI ran in has no `project` link: no project at all.
    let runtimes = setup.stack.state.root().join("runner/runtimes");
    let dirs: Vec<_> = std::fs::read_dir(&runtimes).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(std::fs::symlink_metadata(dirs[0].path().join("project")).is_err());

    // The turn shows each bridge call once (agentd's dispatch, not also the CLI's own report
    // of it), under agentd's request ids, each done with the laptop's receipt. OpenCode's
    // refused shell is shown too: the call and runnerd's refusal as its result.
    let results = of_kind(&events, "tool_result");
    let shown: Vec<&str> = of_kind(&events, "tool_call")
        .into_iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let bridge_calls = ["execute_shell_command", "diff_patch_workspace_file"];
    match cli {
        Cli::Codex => assert_eq!(shown, bridge_calls, "{events:#?}"),
        // Claude Code reports the model's call of its `Bash` and its own refusal (no such
        // tool): shown as the call, failed with what Claude Code told the model.
        Cli::ClaudeCode => {
            assert_eq!(
                shown,
                [&["shell"][..], &bridge_calls].concat(),
                "{events:#?}"
            );
            let refused = results
                .iter()
                .find(|r| r["id"] == "n1")
                .unwrap_or_else(|| panic!("no result of the unavailable shell: {events:#?}"));
            assert_eq!(refused["state"], "failed", "{refused}");
            assert_eq!(refused["error"]["code"], "tool_failed", "{refused}");
            let message = refused["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("No such tool available: Bash"),
                "{refused}"
            );
        }
        Cli::OpenCode => {
            assert_eq!(
                shown,
                [&["bash"][..], &bridge_calls].concat(),
                "{events:#?}"
            );
            let refused = results
                .iter()
                .find(|r| r["id"] == "n1")
                .unwrap_or_else(|| panic!("no result of the refused shell: {events:#?}"));
            // The call is shown, failed with runnerd's refusal; it never ran.
            assert_eq!(refused["state"], "failed", "{refused}");
            assert_eq!(refused["error"]["code"], "refused_by_policy", "{refused}");
            let output = refused["error"]["message"].as_str().unwrap_or_default();
            assert!(
                output.starts_with(
                    "refused by runnerd's policy: the chat is bound to a laptop folder"
                ),
                "{refused}"
            );
        }
    }
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
        let prefix = format!("chat-{}-turn-1-bridge-", cli_setup.chat);
        assert!(request_id.starts_with(&prefix), "{receipts:?}");
        assert_eq!(state, "done", "{receipts:?}");
    }

    // The model: the shell's output came back from the laptop; the CLI's own shell was not
    // there or was refused (the model was told so), and the bridge offered both tools of a
    // writable folder.
    let s1 = model.told("s1");
    assert!(s1.contains("one") && s1.contains("two"), "{s1}");
    assert!(
        s1.contains(repo.to_str().unwrap()),
        "pwd is the laptop folder: {s1}"
    );
    let n1 = model.told("n1");
    assert!(!n1.contains("native\\n"), "the native shell ran: {n1}");
    match &model {
        // Codex answers the model itself ("unsupported call: exec_command"), reporting nothing
        // on its event stream; its shell is not among the tools it offers.
        Model::Responses(responses) => {
            assert!(n1.contains("unsupported call"), "{n1}");
            let first = &responses.requests()[0];
            assert!(
                !first.tool_names().iter().any(|t| t == "exec_command"),
                "{:?}",
                first.tool_names()
            );
        }
        // OpenCode offers its shell and asks before running it; the refusal is its answer.
        Model::Chat(_) => assert!(n1.contains("rejected permission"), "{n1}"),
        // Claude Code (`--tools ""`) answers the model itself: no such tool.
        Model::Messages(_) => assert!(n1.contains("No such tool available: Bash"), "{n1}"),
    }
    assert_eq!(
        model.bridge_tools(),
        ["diff_patch_workspace_file", "execute_shell_command"]
    );
    // The generated instructions say where the hands are.
    let instructions = model.first_request();
    assert!(
        instructions.contains("a folder the person shared from their own computer"),
        "{instructions}"
    );
}

#[test]
fn a_bound_codex_chat_runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell() {
    runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell(Cli::Codex);
}

#[test]
fn a_bound_opencode_chat_runs_the_bridges_shell_and_patch_on_the_laptop_and_its_native_shell_is_refused()
 {
    runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell(Cli::OpenCode);
}

fn with_the_device_offline_fails_its_calls_and_never_touches_the_server(cli: Cli) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = cli.model(
        &runtime,
        vec![
            Step::Bridge(
                "execute_shell_command",
                "s1",
                json!({"command": "echo changed > server.txt"}),
            ),
            Step::Bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "server.txt",
                       "diff": "--- a/server.txt\n+++ b/server.txt\n@@ -1 +1 @@\n-server file\n+changed\n"}),
            ),
            Step::Text("The laptop is offline."),
        ],
    );
    let mut cli_setup = start(cli, &model);
    cli_setup
        .setup
        .executor
        .as_mut()
        .unwrap()
        .child
        .kill()
        .unwrap();
    let _ = cli_setup.setup.executor.as_mut().unwrap().child.wait();
    cli_setup.setup.wait_device(false);
    let setup = &cli_setup.setup;
    let events = turn(
        setup.stack.port,
        &setup.alice,
        &cli_setup.chat,
        "Change server.txt.",
    )
    .unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    for id in ["s1", "p1"] {
        let output = model.told(id);
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
fn a_bound_codex_chat_with_the_device_offline_fails_its_calls_and_never_touches_the_server() {
    with_the_device_offline_fails_its_calls_and_never_touches_the_server(Cli::Codex);
}

#[test]
fn a_bound_opencode_chat_with_the_device_offline_fails_its_calls_and_never_touches_the_server() {
    with_the_device_offline_fails_its_calls_and_never_touches_the_server(Cli::OpenCode);
}

fn on_a_read_only_folder_has_no_patch_tool(cli: Cli) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = cli.model(
        &runtime,
        vec![
            Step::Bridge(
                "diff_patch_workspace_file",
                "p1",
                json!({"filepath": "a.txt", "diff": PATCH}),
            ),
            Step::Text("No patch tool here."),
        ],
    );
    let keys = tempfile::tempdir().unwrap();
    let mut setup = Setup::start_with(true, &cli.config(keys.path(), &model));
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
    let chat = create_chat_with(&setup, cli.agent());
    assert_eq!(setup.bind(&chat).0, 200);
    let events = turn(setup.stack.port, &setup.alice, &chat, "Patch a.txt.").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    assert_eq!(model.bridge_tools(), ["execute_shell_command"]);
    assert_eq!(
        std::fs::read_to_string(repo.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
}

#[test]
fn a_bound_codex_chat_on_a_read_only_folder_has_no_patch_tool() {
    on_a_read_only_folder_has_no_patch_tool(Cli::Codex);
}

#[test]
fn a_bound_opencode_chat_on_a_read_only_folder_has_no_patch_tool() {
    on_a_read_only_folder_has_no_patch_tool(Cli::OpenCode);
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

#[test]
fn a_bound_claude_chat_runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell() {
    runs_the_bridges_shell_and_patch_on_the_laptop_and_has_no_native_shell(Cli::ClaudeCode);
}

#[test]
fn a_bound_claude_chat_with_the_device_offline_fails_its_calls_and_never_touches_the_server() {
    with_the_device_offline_fails_its_calls_and_never_touches_the_server(Cli::ClaudeCode);
}

#[test]
fn a_bound_claude_chat_on_a_read_only_folder_has_no_patch_tool() {
    on_a_read_only_folder_has_no_patch_tool(Cli::ClaudeCode);
}
