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

/// The connection's sign-in as the person's browser would make it: start it, follow the
/// authorization URL (its host replaced by the namespace host's address, which the test's
/// own resolver does not know by name) and deliver the callback. The callback's status.
fn sign_in_through(
    stack: &Stack,
    token: &str,
    authorization_url: &str,
    browser: &agentworks_support::outbound::GuardedClient,
    address: std::net::Ipv4Addr,
) -> u16 {
    let mut url = url::Url::parse(authorization_url).unwrap();
    url.set_host(Some(&address.to_string())).unwrap();
    let location = match block_on(browser.get(url.as_str())) {
        Err(agentworks_support::outbound::OutboundError::Redirect { location, .. }) => location,
        other => panic!("the authorization endpoint did not redirect: {other:?}"),
    };
    let callback = url::Url::parse(&location).unwrap();
    let path = format!("{}?{}", callback.path(), callback.query().unwrap_or(""));
    let auth = format!("Bearer {token}");
    super::harness::http(stack.port, "GET", &path, &[("authorization", &auth)], "").0
}

/// Item 15: the operator sets the `slack` sign-in app, pinned to Slack's issuer (here the
/// provider's server at `mcp.slack.com`, its own authorization server). A connection to
/// `evil.slack.com` (the same provider key, `slack`) whose metadata names its own
/// authorization server never gets the app: the sign-in is refused and no request, and no
/// secret, reaches evil's authorize or token endpoint. The real provider signs in and
/// refreshes with the app; once the app is pinned to another issuer, a refresh no longer sends
/// its secret anywhere; an app stored before apps were pinned (no issuer) is not used, and the
/// refusal says how to set it. Before the fix evil's token endpoint got the `client_secret`.
/// agentd resolves both names through an /etc/hosts of its own (a mount namespace).
#[test]
fn an_operators_sign_in_app_is_used_only_with_the_issuer_it_is_pinned_to() {
    use super::harness::free_port;
    use super::outbound::self_signed_for;

    let netns = Netns::create();
    let (certs, der) = self_signed_for(netns.inside, &["mcp.slack.com", "evil.slack.com"]);
    let browser = agentworks_support::outbound::GuardedClient::builder()
        .add_root_certificate_der(der)
        .build()
        .unwrap();
    let agentd_port = free_port();
    let callback = format!("http://127.0.0.1:{agentd_port}/v1/mcp-connections/callback");
    let secret = "cs-slack-app-5e1d90a7";
    let (real, evil) = (PORT, PORT + 1);
    let _provider = start_sdk_server(
        &netns,
        "oauth_tools.py",
        certs.path(),
        real,
        &[
            "--preregistered",
            "agentworks-app",
            secret,
            &callback,
            "--name",
            "mcp.slack.com",
        ],
    );
    // The attacker's server under the provider's domain knows the app's client id (it is no
    // secret) and approves whatever comes.
    let _evil = start_sdk_server(
        &netns,
        "oauth_tools.py",
        certs.path(),
        evil,
        &[
            "--preregistered",
            "agentworks-app",
            "anything",
            &callback,
            "--name",
            "evil.slack.com",
        ],
    );
    let log_of = |port: u16| {
        let url = format!("https://{}:{port}/test/log", netns.inside);
        String::from_utf8(block_on(browser.get(&url)).unwrap().body.to_vec()).unwrap()
    };

    let files = tempfile::tempdir().unwrap();
    let hosts = files.path().join("hosts");
    std::fs::write(
        &hosts,
        format!(
            "127.0.0.1 localhost\n{} mcp.slack.com evil.slack.com\n",
            netns.inside
        ),
    )
    .unwrap();
    let model = Model::start();
    let config = format!(
        "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{agentd_port}\"\n\
         outbound_root_certificates = [{:?}]\n\n{}",
        certs.path().join("cert.pem").to_str().unwrap(),
        model.config()
    );
    let script = "mount --bind \"$1\" /etc/hosts && shift && exec \"$@\"";
    let wrapper: Vec<&std::ffi::OsStr> = vec![
        "unshare".as_ref(),
        "--mount".as_ref(),
        "--propagation".as_ref(),
        "private".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        script.as_ref(),
        "sh".as_ref(),
        hosts.as_os_str(),
    ];
    let stack = Stack::start_wrapped(agentd_port, &config, &wrapper);
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[]);
    let secret_file = files.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let pin = |issuer: &str| {
        let set = stack.ctl(&[
            "mcp-app",
            "set",
            "slack",
            "--client-id",
            "agentworks-app",
            "--client-secret-file",
            secret_file.to_str().unwrap(),
            "--issuer",
            issuer,
        ]);
        assert!(set.status.success(), "{set:?}");
    };
    let provider_issuer = format!("https://mcp.slack.com:{real}");
    pin(&provider_issuer);
    let add = |name: &str, url: String| {
        let (status, connection) = api(
            &stack,
            &alice,
            "POST",
            "/v1/projects/app/mcp-connections",
            json!({"name": name, "url": url}),
        );
        assert_eq!(status, 201, "{connection}");
        assert_eq!(connection["app_key"], "slack", "{connection}");
        connection
    };
    let sign_in = |connection: &Value| {
        let id = connection["connection_id"].as_str().unwrap();
        api(
            &stack,
            &alice,
            "POST",
            &format!("/v1/projects/app/mcp-connections/{id}/sign-in"),
            Value::Null,
        )
    };

    // evil.slack.com: the app is not handed over. (Before the fix it was: the test then
    // finishes the sign-in as the browser would, and evil's token endpoint gets the secret.)
    let evil_connection = add("Evil", format!("https://evil.slack.com:{evil}/mcp"));
    let (status, body) = sign_in(&evil_connection);
    if status == 200 {
        let url = body["authorization_url"].as_str().unwrap();
        sign_in_through(&stack, &alice, url, &browser, netns.inside);
    }
    let evil_log = log_of(evil);
    assert!(
        !evil_log.contains(secret),
        "the slack app's secret went to evil.slack.com: {evil_log}"
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("app_issuer_mismatch")),
        "{body}"
    );
    assert!(
        !evil_log.contains("authorized") && !evil_log.contains("token-request"),
        "{evil_log}"
    );

    // The provider itself: signed in with the app, whose secret goes to its token endpoint.
    let slack = add("Slack", format!("https://mcp.slack.com:{real}/mcp"));
    let (status, body) = sign_in(&slack);
    assert_eq!(status, 200, "{body}");
    let url = body["authorization_url"].as_str().unwrap().to_owned();
    assert!(url.contains("client_id=agentworks-app"), "{url}");
    assert_eq!(
        sign_in_through(&stack, &alice, &url, &browser, netns.inside),
        303
    );
    assert!(log_of(real).contains(&format!("client_secret={secret}")));
    let whoami = format!("{}whoami", slack["tool_prefix"].as_str().unwrap());
    let chat = create_chat(&stack, &alice, "app");
    let use_it = |message: &str| {
        model.clear();
        model.play(vec![calls(&[("w", &whoami, json!({}))]), text("done")]);
        turn(stack.port, &alice, &chat, message).unwrap()
    };
    let expire = || {
        let url = format!("https://{}:{real}/test/expire", netns.inside);
        block_on(browser.post(&url, "text/plain", "")).unwrap();
    };
    // Refreshed with the app (its issuer's metadata read again first).
    expire();
    let events = use_it("refresh, then call");
    assert_eq!(result_of(&events, "w")["state"], "done", "{events:?}");
    assert!(log_of(real).contains("refreshed "), "{}", log_of(real));

    // Pinned to another issuer now: the next refresh sends the secret nowhere.
    pin(&format!("https://evil.slack.com:{evil}"));
    let requests_before = log_of(real).matches("token-request").count();
    expire();
    let events = use_it("after the app moved");
    let unavailable = of_kind(&events, "connection_unavailable");
    assert_eq!(unavailable[0]["code"], "sign_in_required", "{events:?}");
    assert_eq!(
        log_of(real).matches("token-request").count(),
        requests_before,
        "a refresh went to the provider after its app was pinned elsewhere"
    );
    assert!(!log_of(evil).contains(secret), "{}", log_of(evil));

    // An app stored before apps were pinned: never used, and the refusal says how to fix it.
    pin(&provider_issuer);
    let db =
        rusqlite::Connection::open(stack.state.root().join("agent/mcp_connections.db")).unwrap();
    db.execute("UPDATE mcp_apps SET issuer = NULL", []).unwrap();
    let (status, body) = sign_in(&slack);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("app_not_pinned")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("agentworksctl mcp-app set slack") && message.contains("--issuer"),
        "{message}"
    );
    let shown = stack.ctl(&["mcp-app", "show", "slack"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("pinned to no issuer"),
        "{shown:?}"
    );
}
