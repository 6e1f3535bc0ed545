//! A project's MCP connection signed in with OAuth, end to end against a real OAuth-protected
//! MCP server: the official Python SDK's MCPServer as authorization and resource server
//! (`tests/mcp_server/oauth_tools.py`) over https on a network-namespace host. agentd discovers
//! its metadata, registers dynamically, sends the person to its authorization URL (the test
//! follows the redirect as a browser would), finishes at its callback, seals the tokens, uses
//! them in a turn, and refreshes them when the server stops accepting the access token. Someone
//! else's callback, an unknown state and an editor starting a sign-in are refused; removing the
//! connection removes its sealed sign-in.

use std::process::{Command, Stdio};

use agentworks_support::outbound::{GuardedClient, OutboundError};
use serde_json::{Value, json};

use super::agent::{
    Model, api, calls, code_project, create_chat, of_kind, result_of, text, tool_names, turn, user,
};
use super::harness::{Stack, block_on, http};
use super::mcp_remote::start_sdk_server;
use super::outbound::{Netns, TlsServer, self_signed};

const PORT: u16 = 8443;

/// The callback, as a browser would reach it: `GET` of the path and query of `location`.
fn callback(stack: &Stack, token: &str, location: &str) -> (u16, hyper::HeaderMap, String) {
    callback_on(stack.port, token, location)
}

/// [`callback`] delivered to the agentd on `port` (another host of a cluster).
fn callback_on(port: u16, token: &str, location: &str) -> (u16, hyper::HeaderMap, String) {
    let url = url::Url::parse(location).unwrap();
    let path = format!("{}?{}", url.path(), url.query().unwrap_or(""));
    let auth = format!("Bearer {token}");
    http(port, "GET", &path, &[("authorization", &auth)], "")
}

/// The connection "OAuth Tools" to the namespace host's `/mcp`, added to `app` by `token`'s
/// person (201 asserted).
fn add_oauth_tools(stack: &Stack, token: &str, base: &str) -> Value {
    let (status, connection) = api(
        stack,
        token,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "OAuth Tools", "url": format!("{base}/mcp")}),
    );
    assert_eq!(status, 201, "{connection}");
    connection
}

/// What every test here starts from: the scripted model and a stack trusting the namespace
/// host's certificate (agentd's `outbound_root_certificates`), with alice owning the code
/// project `app`; a client trusting it too, standing in for the person's browser; the host's
/// address. Each test starts the OAuth server itself ([`World::server`]): one needs the
/// stack's callback URL for it first.
struct World {
    stack: Stack,
    model: Model,
    alice: String,
    browser: GuardedClient,
    base: String,
    certs: tempfile::TempDir,
    // Last: the namespace goes after everything that uses it.
    netns: Netns,
}

impl World {
    fn start() -> World {
        World::start_in(super::harness::cluster_mode())
    }

    /// [`World::start`] with the stack in a cluster (`cluster`) or as the suite's mode says.
    fn start_in(cluster: bool) -> World {
        let netns = Netns::create();
        let (certs, der) = self_signed(netns.inside);
        let model = Model::start();
        let agentd_extra = format!(
            "outbound_root_certificates = [{:?}]\n\n{}",
            certs.path().join("cert.pem").to_str().unwrap(),
            model.config()
        );
        let (stack, _) = if cluster {
            Stack::start_in_cluster_with_gateway_and(&agentd_extra)
        } else {
            Stack::start_with_gateway_and(&agentd_extra)
        };
        let alice = user(&stack, "alice");
        code_project(&stack, "app", "alice", &[]);
        World {
            browser: GuardedClient::builder()
                .add_root_certificate_der(der)
                .build()
                .unwrap(),
            base: format!("https://{}:{PORT}", netns.inside),
            stack,
            model,
            alice,
            certs,
            netns,
        }
    }

    /// oauth_tools.py on the namespace host, with `extra` arguments (`--preregistered …`).
    fn server(&self, extra: &[&str]) -> TlsServer {
        start_sdk_server(
            &self.netns,
            "oauth_tools.py",
            self.certs.path(),
            PORT,
            extra,
        )
    }
}

#[test]
fn a_connection_signs_in_with_oauth_its_tokens_are_sealed_used_and_refreshed() {
    let world = World::start();
    let _server = world.server(&[]);
    let World {
        stack,
        model,
        alice,
        browser,
        base,
        ..
    } = &world;
    let server_log = || {
        let body = block_on(browser.get(&format!("{base}/test/log")))
            .unwrap()
            .body;
        String::from_utf8(body.to_vec()).unwrap()
    };
    let connection = add_oauth_tools(stack, alice, base);
    let id = connection["connection_id"].as_str().unwrap().to_owned();
    let whoami = format!("{}whoami", connection["tool_prefix"].as_str().unwrap());
    let sign_in_path = format!("/v1/projects/app/mcp-connections/{id}/sign-in");

    // Not signed in: the turn leaves it out and says so.
    let chat = create_chat(stack, alice, "app");
    model.play(vec![text("no tools yet")]);
    let events = turn(stack.port, alice, &chat, "hi").unwrap();
    let unavailable = of_kind(&events, "connection_unavailable");
    assert_eq!(unavailable[0]["code"], "sign_in_required", "{events:?}");

    // A server whose metadata address redirects to the cloud metadata address: refused, and
    // nothing is fetched from there.
    let (_, trap) = api(
        stack,
        alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Trap", "url": format!("{base}/trap/mcp")}),
    );
    let (status, body) = api(
        stack,
        alice,
        "POST",
        &format!(
            "/v1/projects/app/mcp-connections/{}/sign-in",
            trap["connection_id"].as_str().unwrap()
        ),
        Value::Null,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("redirect_refused")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("169.254.169.254"),
        "{body}"
    );

    // An editor cannot start a sign-in.
    let bob = user(stack, "bob");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "bob", "role": "editor"}),
    );
    let (status, body) = api(stack, &bob, "POST", &sign_in_path, Value::Null);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("forbidden"))
    );

    // The owner starts it: an https authorization URL with PKCE, state and the resource.
    let (status, body) = api(stack, alice, "POST", &sign_in_path, Value::Null);
    assert_eq!(status, 200, "{body}");
    let authorization = url::Url::parse(body["authorization_url"].as_str().unwrap()).unwrap();
    assert_eq!(authorization.scheme(), "https");
    assert_eq!(authorization.path(), "/authorize");
    let query: std::collections::HashMap<_, _> = authorization.query_pairs().into_owned().collect();
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["resource"], format!("{base}/mcp"));
    assert_eq!(query["response_type"], "code");
    assert!(query["state"].len() >= 43, "{query:?}");
    assert!(
        server_log().contains(&format!("registered {} ", query["client_id"])),
        "agentd did not register dynamically: {}",
        server_log()
    );

    // The server approves and sends the browser back with the code.
    // (The guarded client never follows a redirect; it answers where it was sent.)
    let location = match block_on(browser.get(authorization.as_str())) {
        Err(OutboundError::Redirect { status, location }) if status.as_u16() == 302 => location,
        other => panic!("the authorization endpoint did not redirect: {other:?}"),
    };
    assert!(
        location.starts_with(&format!(
            "http://127.0.0.1:{}/v1/mcp-connections/callback?",
            stack.port
        )),
        "{location}"
    );
    // Someone else cannot finish it, nor can an unknown state.
    let (status, _, body) = callback(stack, &bob, &location);
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = callback(stack, alice, &location.replace("state=", "state=forged"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("unknown_sign_in"), "{body}");
    // The person who started it does: back to the settings page, signed in.
    let (status, headers, body) = callback(stack, alice, &location);
    assert_eq!(status, 303, "{body}");
    assert_eq!(
        headers["location"].to_str().unwrap(),
        format!(
            "/console/projects/{}/settings?signed_in={id}",
            connection["project_id"].as_str().unwrap()
        )
    );
    let (_, listed) = api(
        stack,
        alice,
        "GET",
        "/v1/projects/app/mcp-connections",
        Value::Null,
    );
    assert_eq!(listed["connections"][0]["signed_in"], true, "{listed}");
    // The same callback again is refused: a state works once.
    assert_eq!(callback(stack, alice, &location).0, 400);

    // The issued tokens are nowhere under agentd's state in clear.
    let log = server_log();
    let issued: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("issued "))
        .flat_map(|l| l.split(' '))
        .collect();
    assert_eq!(issued.len(), 2, "{log}");
    // (In cluster mode, nor in agentd's rows in PostgreSQL.)
    let in_clear = || {
        issued
            .iter()
            .find_map(|token| stack.agentd_state_holding(token))
    };
    assert_eq!(in_clear(), None, "a token is stored in clear");

    // Used in a turn.
    model.clear();
    model.play(vec![calls(&[("w1", &whoami, json!({}))]), text("done")]);
    let events = turn(stack.port, alice, &chat, "who am I there?").unwrap();
    assert!(tool_names(&model.requests()[0]).contains(&whoami));
    assert_eq!(result_of(&events, "w1")["state"], "done", "{events:?}");
    assert!(server_log().contains(&format!("mcp {}", issued[0])));

    // The server stops accepting the access token: agentd refreshes once and goes on, the
    // refresh token rotated (the old one is spent).
    block_on(browser.post(&format!("{base}/test/expire"), "text/plain", "")).unwrap();
    model.clear();
    model.play(vec![calls(&[("w2", &whoami, json!({}))]), text("again")]);
    let events = turn(stack.port, alice, &chat, "and now?").unwrap();
    assert_eq!(result_of(&events, "w2")["state"], "done", "{events:?}");
    let log = server_log();
    assert!(log.contains(&format!("refreshed {}", issued[1])), "{log}");
    let newest = log
        .lines()
        .filter_map(|l| l.strip_prefix("issued "))
        .next_back()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert_ne!(newest, issued[0]);
    assert!(
        log.ends_with(&format!("mcp {newest}")) || log.contains(&format!("mcp {newest}")),
        "{log}"
    );

    // Removing the connection removes its sealed sign-in.
    let (status, _) = api(
        stack,
        alice,
        "DELETE",
        &format!("/v1/projects/app/mcp-connections/{id}"),
        Value::Null,
    );
    assert_eq!(status, 200);
    assert_eq!(
        stack.agentd_rows("mcp_connections.db", "mcp_credentials"),
        0
    );
}

/// The same sign-in as a person does it: the console's settings page in chromium, the
/// **Sign in to …** button, the server's authorization page, and back to the settings page,
/// which says the connection is signed in; a turn then uses it.
#[test]
fn a_person_signs_a_connection_in_from_the_console() {
    use super::console_sessions::{PASSWORD, origin, passwd};
    super::console::require_browser();
    let world = World::start();
    let _server = world.server(&[]);
    let World {
        stack,
        model,
        alice,
        base,
        ..
    } = &world;
    assert!(passwd(stack, "alice", PASSWORD).status.success());
    let connection = add_oauth_tools(stack, alice, base);
    let shots = std::env::var_os("AGENTWORKS_CONSOLE_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let shot = shots.join("connection-sign-in.png");
    let chat = create_chat(stack, alice, "app");
    model.play(vec![text("the remote tools are not available yet")]);
    let config = json!({
        "chat_url": format!("{}/console/chats/{chat}", origin(stack)),
        "username": "alice",
        "password": PASSWORD,
        "connection": "OAuth Tools",
        "authorization_origin": base,
        "shot": shot,
    });
    let output = Command::new("node")
        .arg("connection-sign-in.mjs")
        .current_dir(super::console::console_dir())
        .env("AGENTWORKS_CONNECTION_SIGN_IN", config.to_string())
        .stderr(Stdio::inherit())
        .output()
        .expect("node runs (apt-get install -y nodejs)");
    assert!(
        output.status.success() && output.stdout == b"ok\n",
        "connection-sign-in.mjs: {:?} {}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    super::console::assert_not_blank(&shot);

    let whoami = format!("{}whoami", connection["tool_prefix"].as_str().unwrap());
    model.clear();
    model.play(vec![calls(&[("w1", &whoami, json!({}))]), text("done")]);
    let events = turn(stack.port, alice, &chat, "who am I there?").unwrap();
    assert_eq!(result_of(&events, "w1")["state"], "done", "{events:?}");
}

/// A server without dynamic registration: the sign-in answers `needs_client_id` with the
/// callback URL and the app key; once an operator sets that app (`agentworksctl mcp-app set`,
/// its secret from a file, sealed, never shown), the sign-in uses it as a confidential client.
#[test]
fn a_server_without_registration_signs_in_with_the_operators_app() {
    let world = World::start();
    let World {
        stack,
        alice,
        browser,
        base,
        netns,
        ..
    } = &world;
    let callback_url = format!(
        "http://127.0.0.1:{}/v1/mcp-connections/callback",
        stack.port
    );
    let secret = "cs-9d41f0c2-operator-secret";
    let _server = world.server(&["--preregistered", "agentworks-app", secret, &callback_url]);
    let (_, connection) = api(
        stack,
        alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Provider", "url": format!("{base}/mcp")}),
    );
    let id = connection["connection_id"].as_str().unwrap().to_owned();
    let app_key = netns.inside.to_string();
    assert_eq!(connection["app_key"], app_key.as_str());
    let sign_in_path = format!("/v1/projects/app/mcp-connections/{id}/sign-in");

    let (status, body) = api(stack, alice, "POST", &sign_in_path, Value::Null);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "needs_client_id");
    assert_eq!(body["error"]["callback_url"], callback_url.as_str());
    assert_eq!(body["error"]["app_key"], app_key.as_str());

    // The operator sets the app; nothing they can read back holds the secret.
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let set = stack.ctl(&[
        "--json",
        "mcp-app",
        "set",
        &app_key,
        "--client-id",
        "agentworks-app",
        "--client-secret-file",
        secret_file.to_str().unwrap(),
        "--issuer",
        base,
    ]);
    assert!(set.status.success(), "{set:?}");
    let shown: Value = serde_json::from_slice(&set.stdout).unwrap();
    assert_eq!(shown["client_id"], "agentworks-app");
    assert_eq!(shown["has_secret"], true);
    assert_eq!(shown["callback_url"], callback_url.as_str());
    for args in [
        vec!["mcp-app", "list"],
        vec!["--json", "mcp-app", "list"],
        vec!["mcp-app", "show", &app_key],
    ] {
        let out = stack.ctl(&args);
        assert!(out.status.success(), "{out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(secret),
            "{args:?} shows the secret"
        );
    }

    let (status, body) = api(stack, alice, "POST", &sign_in_path, Value::Null);
    assert_eq!(status, 200, "{body}");
    let authorization = url::Url::parse(body["authorization_url"].as_str().unwrap()).unwrap();
    let query: std::collections::HashMap<_, _> = authorization.query_pairs().into_owned().collect();
    assert_eq!(query["client_id"], "agentworks-app");
    let location = match block_on(browser.get(authorization.as_str())) {
        Err(OutboundError::Redirect { location, .. }) => location,
        other => panic!("the authorization endpoint did not redirect: {other:?}"),
    };
    let (status, _, body) = callback(stack, alice, &location);
    assert_eq!(status, 303, "{body}");
    let (_, listed) = api(
        stack,
        alice,
        "GET",
        "/v1/projects/app/mcp-connections",
        Value::Null,
    );
    assert_eq!(listed["connections"][0]["signed_in"], true, "{listed}");
    // The secret is sealed at rest too (in cluster mode, in PostgreSQL as well).
    assert_eq!(stack.agentd_state_holding(secret), None);
    // Removed, the next sign-in needs it again.
    let removed = stack.ctl(&["mcp-app", "remove", &app_key]);
    assert!(removed.status.success(), "{removed:?}");
    let (status, body) = api(stack, alice, "POST", &sign_in_path, Value::Null);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("needs_client_id"))
    );
}

/// In a cluster, a sign-in started on one agentd host finishes at another's callback (its
/// verifier and state wait in the shared database, sealed): a load balancer need not send both
/// requests to one host. Kept in the first host's memory, the second answered
/// `unknown_sign_in`.
#[test]
fn a_sign_in_started_on_one_host_finishes_on_another() {
    let world = World::start_in(true);
    let _server = world.server(&[]);
    let World {
        stack,
        alice,
        browser,
        base,
        ..
    } = &world;
    let (_agentd_b, port_b) = stack.start_agentd_host("host-b");
    let connection = add_oauth_tools(stack, alice, base);
    let id = connection["connection_id"].as_str().unwrap();
    let location = start_sign_in(stack, alice, id, browser);
    let (status, _, body) = callback_on(port_b, alice, &location);
    assert_eq!(status, 303, "{body}");
    let auth = format!("Bearer {alice}");
    let (status, _, listed) = http(
        port_b,
        "GET",
        "/v1/projects/app/mcp-connections",
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["connections"][0]["signed_in"], true, "{listed}");
    // Taken once: the same callback on the first host is refused.
    assert_eq!(callback(stack, alice, &location).0, 400);
}

/// Starts the sign-in of connection `id` of project `app` and follows the authorization URL as
/// a browser would: where the server sends the browser back (the callback with the code).
fn start_sign_in(stack: &Stack, token: &str, id: &str, browser: &GuardedClient) -> String {
    let path = format!("/v1/projects/app/mcp-connections/{id}/sign-in");
    let (status, body) = api(stack, token, "POST", &path, Value::Null);
    assert_eq!(status, 200, "{body}");
    match block_on(browser.get(body["authorization_url"].as_str().unwrap())) {
        Err(OutboundError::Redirect { location, .. }) => location,
        other => panic!("the authorization endpoint did not redirect: {other:?}"),
    }
}

/// The sign-in `token`'s person makes for connection `id` of project `app`, as a browser
/// would follow it; returns once the callback answered 303.
fn sign_in(stack: &Stack, token: &str, id: &str, browser: &GuardedClient) {
    let location = start_sign_in(stack, token, id, browser);
    let (status, _, body) = callback(stack, token, &location);
    assert_eq!(status, 303, "{body}");
}

/// A sign-in acts as the person who made it: when they leave the project, or their account is
/// disabled, the project stops using it (it is removed, and turns report `sign_in_required`).
#[test]
fn a_sign_in_goes_with_the_person_who_made_it() {
    let world = World::start();
    let _server = world.server(&[]);
    let World {
        stack,
        model,
        alice,
        browser,
        base,
        ..
    } = &world;
    let carol = user(stack, "carol");
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "carol", "role": "co-owner"}),
    );
    let (_, connection) = api(
        stack,
        alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "OAuth Tools", "url": format!("{base}/mcp")}),
    );
    let id = connection["connection_id"].as_str().unwrap().to_owned();
    let whoami = format!("{}whoami", connection["tool_prefix"].as_str().unwrap());
    let chat = create_chat(stack, alice, "app");
    let sign_ins = || stack.agentd_rows("mcp_connections.db", "mcp_credentials");
    let offered = |message: &str| {
        model.clear();
        model.play(vec![text("ok")]);
        let events = turn(stack.port, alice, &chat, message).unwrap();
        (
            tool_names(&model.requests()[0]).contains(&whoami),
            of_kind(&events, "connection_unavailable")
                .first()
                .map(|u| u["message"].as_str().unwrap().to_owned()),
        )
    };

    // carol signs in; alice's chat uses carol's sign-in.
    sign_in(stack, &carol, &id, browser);
    assert_eq!(offered("with carol's sign-in"), (true, None));
    // carol leaves the project: her sign-in goes with her.
    stack.admin("members/remove", json!({"project": "app", "user": "carol"}));
    let (used, why) = offered("carol left");
    assert!(!used);
    assert!(
        why.as_deref().unwrap_or_default().contains("carol"),
        "{why:?}"
    );
    assert_eq!(sign_ins(), 0);

    // alice signs in, then her account is disabled: the sign-in is not used (and the turn
    // itself is refused: a disabled person has no chats either).
    sign_in(stack, alice, &id, browser);
    assert_eq!(sign_ins(), 1);
    assert_eq!(offered("with alice's sign-in"), (true, None));
    stack.admin(
        "members/add",
        json!({"project": "app", "user": "carol", "role": "owner"}),
    );
    let carol_chat = create_chat(stack, &carol, "app");
    stack.admin("users/disable", json!({"name": "alice"}));
    model.clear();
    model.play(vec![text("ok")]);
    let events = turn(stack.port, &carol, &carol_chat, "alice is disabled").unwrap();
    assert!(!tool_names(&model.requests()[0]).contains(&whoami));
    let unavailable = of_kind(&events, "connection_unavailable");
    assert!(
        unavailable[0]["message"]
            .as_str()
            .unwrap()
            .contains("alice"),
        "{events:?}"
    );
    assert_eq!(sign_ins(), 0);
}
