//! A chat's agent (issue 45) through the real agentd: `api` or a coding CLI that the real
//! runnerd runs. Without runnerd: every chat is an `api` chat in Run mode unless asked
//! otherwise, `GET /v1/agents` offers `api` alone and says runnerd is not running, and asking for
//! another agent or for Builder on `api` is refused with a sentence. With runnerd and its
//! providers: the providers are offered (an unavailable one with its reason), Builder only to
//! authoring roles (binding a CLI chat to a laptop folder: `suite::agent_cli_laptop`). End to end, with the real
//! Codex against a scripted Responses server: a Run chat's turn streams the CLI's text and its
//! folded tool calls, stores the answer and the usage, a second turn resumes the thread, Stop
//! ends the turn, and a turn without runnerd fails at once with the sentence saying so.
//!
//! In cluster mode (`AGENTWORKS_TEST_CLUSTER=1`) the same tests reach runnerd over NATS only
//! (`[runnerd] serve_cluster`, agentd's `workspaced_host`; its socket moved away).

use super::agent::{api, code_project, create_chat, of_kind, turn, user};
use super::harness::*;
use super::runner_support::codex_binary;
use super::runner_support::responses::{Reply, ScriptedResponses, USAGE_PER_REPLY};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn create(stack: &Stack, token: &str, body: Value) -> (u16, Value) {
    api(stack, token, "POST", "/v1/chats", body)
}

/// `[runnerd]` with a `codex` provider (the real Codex, its upstream `upstream`) and `ghost`,
/// whose executable does not exist.
pub(super) fn runnerd_config(state_hint: &std::path::Path, upstream: &str) -> String {
    let key_file = state_hint.join("provider.key");
    std::fs::write(&key_file, "sk-test-operator-key\n").unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    format!(
        "[runnerd]\nmax_processes = 256\n\n\
         [runnerd.providers.codex]\ndriver = \"codex\"\nexecutable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{upstream}\"\nkey_file = \"{}\"\n\n\
         [runnerd.providers.ghost]\ndriver = \"codex\"\nexecutable = \"/nonexistent/ghost-cli\"\nmodel = \"scripted\"\nupstream = \"{upstream}\"\nkey_file = \"{}\"\n",
        codex_binary().display(),
        key_file.display(),
        key_file.display(),
    )
}

#[test]
fn without_runnerd_chats_are_api_chats_and_asking_for_a_cli_says_runnerd_is_not_running() {
    let stack = Stack::start();
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "a\n")]);

    let (status, agents) = api(&stack, &alice, "GET", "/v1/agents", Value::Null);
    assert_eq!(status, 200, "{agents}");
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api"], "{agents}");
    assert_eq!(agents["agents"][0]["modes"], json!(["run"]));
    assert_eq!(agents["runnerd"]["running"], false);
    assert!(
        agents["runnerd"]["message"]
            .as_str()
            .unwrap()
            .contains("runnerd is not running: start agentworks-runnerd"),
        "{agents}"
    );

    // The default: the model loop, in Run mode, shown by GET and the list.
    let chat = create_chat(&stack, &alice, "app");
    let (status, got) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(status, 200, "{got}");
    assert_eq!(
        (&got["agent"], &got["mode"]),
        (&json!("api"), &json!("run"))
    );
    let (_, listed) = api(&stack, &alice, "GET", "/v1/chats", Value::Null);
    assert_eq!(listed["chats"][0]["agent"], "api");
    assert_eq!(listed["chats"][0]["mode"], "run");
    let (status, explicit) = create(
        &stack,
        &alice,
        json!({"project": "app", "agent": "api", "mode": "run"}),
    );
    assert_eq!(
        (status, &explicit["agent"]),
        (201, &json!("api")),
        "{explicit}"
    );

    let (status, refused) = create(&stack, &alice, json!({"project": "app", "agent": "codex"}));
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], "unknown_agent");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("runnerd is not running"), "{message}");
    assert!(message.contains("the only agent is \"api\""), "{message}");

    let (status, refused) = create(&stack, &alice, json!({"project": "app", "mode": "builder"}));
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_mode");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Builder mode is for a coding CLI's chat"),
        "{refused}"
    );
    let (status, refused) = create(&stack, &alice, json!({"project": "app", "mode": "root"}));
    assert_eq!(
        (status, &refused["error"]["code"]),
        (400, &json!("invalid_mode"))
    );
    // Nothing refused was created.
    let (_, listed) = api(&stack, &alice, "GET", "/v1/chats", Value::Null);
    assert_eq!(listed["chats"].as_array().unwrap().len(), 2, "{listed}");
}

/// runnerd with `codex` and `ghost`, an upstream that answers nothing (no turn runs here).
fn stack_with_runnerd() -> (Stack, Runnerd, tempfile::TempDir) {
    let keys = tempfile::tempdir().unwrap();
    let (stack, runnerd) =
        Stack::start_with_runnerd(&runnerd_config(keys.path(), "http://127.0.0.1:9/v1"));
    (stack, runnerd, keys)
}

#[test]
fn with_runnerd_its_providers_are_offered_and_builder_is_for_authoring_roles_only() {
    let (stack, runnerd, _keys) = stack_with_runnerd();
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "a\n")]);

    let (status, agents) = api(&stack, &alice, "GET", "/v1/agents", Value::Null);
    assert_eq!(status, 200, "{agents}");
    assert_eq!(agents["runnerd"]["running"], true, "{agents}");
    let agent = |name: &str| {
        agents["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap_or_else(|| panic!("no agent {name}: {agents}"))
            .clone()
    };
    let codex = agent("codex");
    assert_eq!(
        (
            &codex["kind"],
            &codex["driver"],
            &codex["model"],
            &codex["available"]
        ),
        (
            &json!("cli"),
            &json!("codex"),
            &json!("scripted"),
            &json!(true)
        )
    );
    assert_eq!(codex["modes"], json!(["run", "builder"]));
    let ghost = agent("ghost");
    assert_eq!(ghost["available"], false);
    assert!(ghost["unavailable"].as_str().is_some(), "{ghost}");

    // The owner starts a Run and a Builder chat of codex; GET shows each as created.
    for mode in ["run", "builder"] {
        let (status, chat) = create(
            &stack,
            &alice,
            json!({"project": "app", "agent": "codex", "mode": mode}),
        );
        assert_eq!(status, 201, "{chat}");
        let id = chat["chat_id"].as_str().unwrap();
        let (_, got) = api(
            &stack,
            &alice,
            "GET",
            &format!("/v1/chats/{id}"),
            Value::Null,
        );
        assert_eq!(
            (&got["agent"], &got["mode"]),
            (&json!("codex"), &json!(mode))
        );
    }

    // A viewer and a runner may start a Run chat of codex, never a Builder one; an editor may.
    for (name, role, builder) in [
        ("vera", "viewer", false),
        ("rudi", "runner", false),
        ("edna", "editor", true),
    ] {
        let token = user(&stack, name);
        stack.admin(
            "members/add",
            json!({"project": "app", "user": name, "role": role}),
        );
        let (status, chat) = create(
            &stack,
            &token,
            json!({"project": "app", "agent": "codex", "mode": "builder"}),
        );
        if builder {
            assert_eq!(status, 201, "{role}: {chat}");
        } else {
            assert_eq!(status, 403, "{role}: {chat}");
            assert_eq!(chat["error"]["code"], "forbidden");
            assert_eq!(chat["error"]["reason"], "no_authoring_role");
            assert!(
                chat["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Builder"),
                "{chat}"
            );
        }
        let (status, chat) = create(&stack, &token, json!({"project": "app", "agent": "codex"}));
        assert_eq!(
            (status, &chat["mode"]),
            (201, &json!("run")),
            "{role}: {chat}"
        );
    }

    // An unavailable provider is refused with runnerd's reason; an unknown one lists the agents.
    let (status, refused) = create(&stack, &alice, json!({"project": "app", "agent": "ghost"}));
    assert_eq!(
        (status, &refused["error"]["code"]),
        (400, &json!("agent_unavailable")),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains(ghost["unavailable"].as_str().unwrap()),
        "{refused}"
    );
    let (status, refused) = create(&stack, &alice, json!({"project": "app", "agent": "claude"}));
    assert_eq!(
        (status, &refused["error"]["code"]),
        (400, &json!("unknown_agent"))
    );
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains(r#""api", "codex", "ghost""#), "{message}");

    // runnerd gone: only api is offered again, and a new CLI chat is refused saying why.
    drop(runnerd);
    let (_, agents) = api(&stack, &alice, "GET", "/v1/agents", Value::Null);
    assert_eq!(agents["agents"].as_array().unwrap().len(), 1, "{agents}");
    let (status, refused) = create(&stack, &alice, json!({"project": "app", "agent": "codex"}));
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("runnerd is not running"),
        "{refused}"
    );
}

/// The real Codex through the real runnerd, from the chat API.
#[test]
fn a_cli_chat_runs_its_turns_through_runnerd_and_resumes_its_thread() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", "cat project/a.txt"),
            Reply::Text("The file says alpha.".into()),
            Reply::Text("Still alpha.".into()),
        ]))
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (stack, runnerd) =
        Stack::start_with_runnerd(&runnerd_config(keys.path(), &model.base_url()));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "alpha\n")]);
    let (status, chat) = create(&stack, &alice, json!({"project": "app", "agent": "codex"}));
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();

    let events = turn(stack.port, &alice, &chat, "What does a.txt say?").unwrap();
    let end = &of_kind(&events, "end")[0];
    assert_eq!(end["reason"], "completed", "{events:#?}");
    let call = &of_kind(&events, "tool_call")[0];
    assert!(
        call["arguments"]["command"]
            .as_str()
            .unwrap()
            .contains("cat project/a.txt"),
        "{events:#?}"
    );
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
    assert!(end["usage"]["total_tokens"].as_u64().unwrap() > 0, "{end}");

    // The chat keeps the question, the call and its result, and the answer; the usage counts.
    let (_, got) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    let messages = got["messages"].as_array().unwrap();
    assert_eq!(messages.first().unwrap()["content"], "What does a.txt say?");
    assert_eq!(messages.last().unwrap()["role"], "assistant", "{got}");
    assert!(
        messages.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .contains("alpha"),
        "{got}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m["role"] == "tool" && m["state"] == "done"),
        "{got}"
    );
    // Two model requests (the call, the answer), each counted by runnerd's gateway.
    assert_eq!(
        got["usage"]["turns"][0]["prompt_tokens"].as_u64(),
        Some(2 * USAGE_PER_REPLY.0),
        "{got}"
    );

    // The second turn resumes the thread: the model sees the first turn's conversation.
    let events = turn(stack.port, &alice, &chat, "And now?").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    let last = serde_json::to_string(requests.last().unwrap().input()).unwrap();
    assert!(last.contains("What does a.txt say?"), "{last}");
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
        "the second turn counts its own tokens only: {got}"
    );

    // Without runnerd, the next turn fails at once with the sentence, and the message is kept.
    drop(runnerd);
    let started = Instant::now();
    let events = turn(stack.port, &alice, &chat, "Are you there?").unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let error = &of_kind(&events, "error")[0];
    assert_eq!(error["code"], "runnerd_not_running", "{events:#?}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("runnerd is not running: start agentworks-runnerd"),
        "{error}"
    );
    let (_, got) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(
        got["messages"].as_array().unwrap().last().unwrap()["content"],
        "Are you there?"
    );
}

/// Stop mid-command: runnerd is told, and the turn ends `cancelled` within seconds.
#[test]
fn stopping_a_cli_turn_cancels_it_in_runnerd() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![Reply::exec_command(
            "c1",
            "sleep 120",
        )]))
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (stack, _runnerd) =
        Stack::start_with_runnerd(&runnerd_config(keys.path(), &model.base_url()));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "alpha\n")]);
    let (_, chat) = create(&stack, &alice, json!({"project": "app", "agent": "codex"}));
    let chat = chat["chat_id"].as_str().unwrap().to_owned();

    let port = stack.port;
    let (token, id) = (alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "Wait a while."));
    // The command has started once the model was asked and a moment has passed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while model.requests().is_empty() {
        assert!(Instant::now() < deadline, "Codex never asked the model");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let stopped = Instant::now();
    let (status, body) = api(
        &stack,
        &alice,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        Value::Null,
    );
    assert_eq!(status, 202, "{body}");
    let events = running.join().unwrap().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "cancelled",
        "{events:#?}"
    );
}

/// A Builder chat edits one file natively and another through the bridge's patch, which
/// agentd applies through workspaced's guarded patch: a receipt for the second.
#[test]
fn a_builder_chat_edits_natively_and_through_the_bridges_patch() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", "echo native > project/b.txt && echo wrote"),
            Reply::McpCall {
                server: "bridge".into(),
                tool: "diff_patch_workspace_file".into(),
                call_id: "c2".into(),
                arguments: json!({"filepath": "a.txt", "diff": "@@ -1 +1 @@\n-alpha\n+beta\n"}),
            },
            Reply::Text("Both edited.".into()),
        ]))
        .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let (stack, _runnerd) =
        Stack::start_with_runnerd(&runnerd_config(keys.path(), &model.base_url()));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("a.txt", "alpha\n")]);
    let root = stack.state.documents().join("app");
    let (status, chat) = create(
        &stack,
        &alice,
        json!({"project": "app", "agent": "codex", "mode": "builder"}),
    );
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();
    let events = turn(stack.port, &alice, &chat, "Edit both files.").unwrap();
    let end = &of_kind(&events, "end")[0];
    assert_eq!(end["reason"], "completed", "{events:#?}");
    assert_eq!(
        std::fs::read_to_string(root.join("b.txt")).unwrap(),
        "native\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "beta\n"
    );
    let calls = of_kind(&events, "tool_call");
    let patch = calls
        .iter()
        .find(|c| c["name"] == "diff_patch_workspace_file")
        .unwrap_or_else(|| panic!("no bridge patch call: {events:#?}"));
    let result = of_kind(&events, "tool_result")
        .into_iter()
        .find(|r| r["id"] == patch["id"])
        .unwrap();
    assert_eq!(result["state"], "done", "{result}");
    let receipt = result["result"].to_string();
    assert!(receipt.contains("receipt"), "{receipt}");
    assert!(
        receipt.contains("-bridge-"),
        "the request id is agentd's: {receipt}"
    );
    // The model got the patch's answer back through the bridge.
    let requests = model.requests();
    let last = serde_json::to_string(requests.last().unwrap().input()).unwrap();
    assert!(last.contains("applied"), "{last}");
}

/// Issue 45, point 6: the project's MCP connection tools reach a coding CLI through the bridge,
/// for authoring roles only. The connection is the one the model loop's test uses
/// (`suite::mcp_remote`: the official Python SDK's server over https in a network namespace);
/// the owner's Codex calls its `echo` in the namespace `mcp__bridge`, agentd runs the call
/// through the turn's one tool executor, and the result reaches the model's next request. A
/// viewer's Run chat is offered the two built-in bridge tools and no connection tool.
#[test]
fn an_owners_cli_chat_calls_a_connections_tool_through_the_bridge_and_a_viewers_is_not_offered_it()
{
    use super::mcp_remote::start_sdk_server;
    use super::outbound::{Netns, self_signed};
    const PORT: u16 = 8443;

    let netns = Netns::create();
    let (certs, _der) = self_signed(netns.inside);
    let _server = start_sdk_server(&netns, "netns_tools.py", certs.path(), PORT, &[]);
    let keys = tempfile::tempdir().unwrap();
    // The upstream is set once the connection's tool name is known (the model's script names
    // it): runnerd starts again then, on the config with the scripted model's URL.
    let placeholder = "http://127.0.0.1:9/v1";
    let (stack, first_runnerd) = Stack::start_with_runnerd(&format!(
        "outbound_root_certificates = [{:?}]\n\n{}",
        certs.path().join("cert.pem").to_str().unwrap(),
        runnerd_config(keys.path(), placeholder)
    ));
    let olive = user(&stack, "olive");
    code_project(&stack, "app", "olive", &[("a.txt", "alpha\n")]);
    let vera = user(&stack, "vera");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "vera", "role": "viewer"}),
    );
    let (status, connection) = api(
        &stack,
        &olive,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Netns Tools", "url": format!("https://{}:{PORT}/mcp", netns.inside)}),
    );
    assert_eq!(status, 201, "{connection}");
    let prefix = connection["tool_prefix"].as_str().unwrap().to_owned();
    let echo = format!("{prefix}echo");

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::McpCall {
                server: "bridge".into(),
                tool: echo.clone(),
                call_id: "m1".into(),
                arguments: json!({"text": "via the bridge"}),
            },
            Reply::Text("The server echoed it.".into()),
            Reply::Text("I can only read here.".into()),
        ]))
        .unwrap();
    drop(first_runnerd);
    let config_path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, config.replace(placeholder, &model.base_url())).unwrap();
    let mut runnerd = Runnerd::start(&stack.state);
    if cluster_mode() {
        runnerd.only_over_nats();
    }

    // The owner's Run chat: the connection's tool is offered in the bridge's namespace, called,
    // and its result goes back to the model.
    let (status, chat) = create(&stack, &olive, json!({"project": "app", "agent": "codex"}));
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();
    let events = turn(stack.port, &olive, &chat, "Echo something.").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    let offered = requests[0]
        .tool("mcp__bridge")
        .unwrap_or_else(|| panic!("no mcp__bridge in {:?}", requests[0].tool_names()))
        .to_string();
    assert!(
        offered.contains(&echo) && offered.contains("execute_shell_command"),
        "{offered}"
    );
    assert!(
        offered.contains("[MCP server \\\"Netns Tools\\\"] Echo the text back."),
        "{offered}"
    );
    let call = of_kind(&events, "tool_call")
        .into_iter()
        .find(|c| c["name"] == echo.as_str())
        .unwrap_or_else(|| panic!("no call of {echo}: {events:#?}"));
    assert_eq!(call["arguments"]["text"], "via the bridge");
    let result = of_kind(&events, "tool_result")
        .into_iter()
        .find(|r| r["id"] == call["id"])
        .unwrap();
    assert_eq!(result["state"], "done", "{result}");
    assert_eq!(
        result["result"]["content"], "echo: via the bridge",
        "{result}"
    );
    let answered = requests
        .iter()
        .flat_map(|r| r.input())
        .find(|item| item["type"] == "function_call_output" && item["call_id"] == "m1")
        .unwrap_or_else(|| panic!("the model never got m1's output: {requests:#?}"))
        .to_string();
    assert!(answered.contains("echo: via the bridge"), "{answered}");

    // The viewer's Run chat: the bridge offers its two built-ins, no connection tool.
    let (status, chat) = create(&stack, &vera, json!({"project": "app", "agent": "codex"}));
    assert_eq!(status, 201, "{chat}");
    let chat = chat["chat_id"].as_str().unwrap().to_owned();
    let before = model.requests().len();
    let events = turn(stack.port, &vera, &chat, "What can you use?").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let requests = model.requests();
    let offered = requests[before]
        .tool("mcp__bridge")
        .unwrap_or_else(|| panic!("no mcp__bridge in {:?}", requests[before].tool_names()))
        .to_string();
    assert!(
        offered.contains("execute_shell_command") && offered.contains("diff_patch_workspace_file"),
        "{offered}"
    );
    assert!(
        !offered.contains(&prefix) && !offered.contains("Netns Tools"),
        "a viewer was offered a connection's tool: {offered}"
    );
}
