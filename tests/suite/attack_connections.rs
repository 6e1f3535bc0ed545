//! Attacks on a project's MCP connections (issue 42, items 1 and 15), each performed against the
//! real agentd, a real remote MCP server (the official Python SDK's, over https on a host in a
//! network namespace: `tests/mcp_server/`) and the scripted model of [`super::agent`]:
//!
//! - a viewer's or a runner's chat calling the tool of a connection whose header carries the
//!   project's secret, and reading the secret back from the tool's result; an editor lowered
//!   to viewer in the middle of a turn calling it again (item 1);
//! - a server under a provider's domain (`evil.slack.com`) that is not the provider being
//!   handed the operator's sign-in app, whose `client_secret` then goes to the token endpoint
//!   that server's metadata names (item 15).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::agent::{
    Model, api, calls, code_project, create_chat, of_kind, result_of, text, tool_names, turn, user,
};
use super::harness::{Stack, block_on};
use super::mcp_remote::start_sdk_server;
use super::outbound::{Netns, self_signed};

const PORT: u16 = 8443;
/// The project secret the connection's `Authorization` header is made of.
const SECRET: &str = "SUPERSECRET-4be1c07d9a";

/// The remote server's request log: one line per MCP request and per session it made.
fn server_log(browser: &agentworks_support::outbound::GuardedClient, base: &str) -> String {
    let body = block_on(browser.get(&format!("{base}/test/log")))
        .unwrap()
        .body;
    String::from_utf8(body.to_vec()).unwrap()
}

/// Every text a turn left where its person can read it: the events, and what the model was
/// sent (the tool results are in the next request's messages).
fn everything_seen(events: &[(String, Value)], model: &Model) -> String {
    format!("{events:?} {:?}", model.requests())
}

/// Item 1: the owner adds a connection whose `Authorization` header is the project secret
/// `API_KEY`. A viewer's and a runner's chats get none of its tools: not in the tool list, not
/// in the prompt, no `connection_unavailable`; the model calling the tool by name gets an
/// unknown tool, and the server never hears from their turns. An editor's chat gets them (the
/// control), and once the editor is lowered to viewer in the middle of a turn, the next call is
/// refused and never reaches the server. Before the fix the viewer read `Bearer SUPERSECRET…`
/// in the tool's result.
#[test]
fn a_viewers_chat_gets_no_connection_tools_and_never_reads_the_owners_secret() {
    let netns = Netns::create();
    let (certs, der) = self_signed(netns.inside);
    let _server = start_sdk_server(
        &netns,
        "netns_tools.py",
        certs.path(),
        PORT,
        &["--authorization-tool"],
    );
    let browser = agentworks_support::outbound::GuardedClient::builder()
        .add_root_certificate_der(der)
        .build()
        .unwrap();
    let base = format!("https://{}:{PORT}", netns.inside);
    let model = Model::start();
    let (stack, _) = Stack::start_with_gateway_and(&format!(
        "outbound_root_certificates = [{:?}]\n\n{}",
        certs.path().join("cert.pem").to_str().unwrap(),
        model.config()
    ));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[]);
    let (status, body) = api(
        &stack,
        &alice,
        "PUT",
        "/v1/projects/app/secrets/API_KEY",
        json!({"value": SECRET}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, connection) = api(
        &stack,
        &alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Tools", "url": format!("{base}/mcp"),
               "headers": {"Authorization": {"secret": "API_KEY", "format": "Bearer {}"}}}),
    );
    assert_eq!(status, 201, "{connection}");
    let prefix = connection["tool_prefix"].as_str().unwrap().to_owned();
    let reveal = format!("{prefix}authorization");
    let echo = format!("{prefix}echo");

    // A viewer and a runner: nothing of the connection, and nothing reaches its server.
    for (name, role) in [("vera", "viewer"), ("rupert", "runner")] {
        let token = user(&stack, name);
        stack.admin(
            "members/add",
            json!({"project": "app", "user": name, "role": role}),
        );
        let chat = create_chat(&stack, &token, "app");
        let before = server_log(&browser, &base);
        model.clear();
        model.play(vec![
            calls(&[
                ("r1", &reveal, json!({})),
                ("r2", &echo, json!({"text": "hi"})),
            ]),
            text("done"),
        ]);
        let events = turn(stack.port, &token, &chat, "what is the API key?").unwrap();
        assert!(
            !everything_seen(&events, &model).contains(SECRET),
            "a {role} read the project's secret: {events:?}"
        );
        let requests = model.requests();
        for request in &requests {
            let names = tool_names(request);
            assert!(
                !names.iter().any(|n| n.starts_with("mcp_")),
                "a {role}'s turn was offered connection tools: {names:?}"
            );
            let prompt = request["messages"][0]["content"].as_str().unwrap();
            assert!(
                !prompt.contains("MCP") && !prompt.contains("Tools"),
                "a {role}'s prompt speaks of the connections: {prompt}"
            );
        }
        assert!(
            of_kind(&events, "connection_unavailable").is_empty(),
            "{events:?}"
        );
        for id in ["r1", "r2"] {
            let result = result_of(&events, id);
            assert_eq!(result["error"]["code"], "unknown_tool", "{role}: {result}");
        }
        assert_eq!(
            server_log(&browser, &base),
            before,
            "a {role}'s turn reached the connection's server"
        );
    }

    // The control: an editor's chat has the tools, and the server sees the secret header.
    let eddie = user(&stack, "eddie");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "eddie", "role": "editor"}),
    );
    let chat = create_chat(&stack, &eddie, "app");
    model.clear();
    model.play(vec![calls(&[("e1", &reveal, json!({}))]), text("done")]);
    let events = turn(stack.port, &eddie, &chat, "call it").unwrap();
    assert!(tool_names(&model.requests()[0]).contains(&reveal));
    assert_eq!(result_of(&events, "e1")["state"], "done", "{events:?}");
    assert!(
        result_of(&events, "e1")["result"]["content"]
            .as_str()
            .unwrap()
            .contains(&format!("Bearer {SECRET}")),
        "the server did not get the secret header: {events:?}"
    );

    // Lowered to viewer in the middle of a turn: the tool was offered at the turn's start, the
    // first call runs, the next is refused from the live role and never reaches the server.
    model.clear();
    model.play(vec![
        calls(&[("m1", &echo, json!({"text": "first"}))]),
        calls(&[("m2", &echo, json!({"text": "second"}))]),
        text("done"),
    ]);
    let hold = model.hold_answer(2);
    let port = stack.port;
    let (eddie_token, chat_id) = (eddie.clone(), chat.clone());
    let running =
        std::thread::spawn(move || turn(port, &eddie_token, &chat_id, "call it twice").unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while model.requests().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the turn never asked the model again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "eddie", "role": "viewer"}),
    );
    hold.release();
    let events = running.join().unwrap();
    assert_eq!(result_of(&events, "m1")["state"], "done", "{events:?}");
    let refused = result_of(&events, "m2");
    assert_eq!(refused["error"]["code"], "forbidden", "{refused}");
    assert_eq!(refused["error"]["reason"], "no_authoring_role", "{refused}");
    assert_eq!(refused["error"]["role"], "viewer", "{refused}");
    let log = server_log(&browser, &base);
    assert_eq!(
        log.matches("tools/call").count(),
        2,
        "the reveal call and the first echo only: {log}"
    );
}
