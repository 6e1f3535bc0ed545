//! agentd's client for remote MCP servers (`agentworks_agent::connections::remote`) against a real one:
//! the official Python SDK's server (`tests/mcp_server/netns_tools.py`) over https, on a host in
//! a network namespace at a public-looking address (`suite::outbound`'s [`Netns`]), with a
//! certificate the client trusts only because the test adds it. The session initialises, lists
//! the tools and calls them; a header the server needs is sent; a server that wants a sign-in
//! says so with its challenge; a redirect to the metadata address and a loopback URL are
//! refused before any request reaches them.
//!
//! Needs root and iproute2 (`ip netns`), openssl and the MCP Python SDK (`.ci/run` installs
//! them); without them the test fails and says so.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentworks_agent::connections::remote::{RemoteError, RemoteSession};
use agentworks_agent::connections::store::Transport;
use agentworks_support::outbound::GuardedClient;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::harness::mcp_python;
use super::outbound::{Netns, TlsServer, self_signed, stderr_of};

const PORT: u16 = 8443;
const HTTP: Transport = Transport::StreamableHttp;

/// The SDK's server in the namespace; waits until it accepts connections.
fn start_server(netns: &Netns, cert_dir: &std::path::Path) -> TlsServer {
    start_server_on(netns, cert_dir, PORT)
}

/// [`start_server`] on `port`.
fn start_server_on(netns: &Netns, cert_dir: &std::path::Path, port: u16) -> TlsServer {
    start_sdk_server(netns, "netns_tools.py", cert_dir, port, &[])
}

/// `tests/mcp_server/<script>` (an official Python SDK server) in the namespace, over TLS on
/// `port` with `extra` arguments; returns once it accepts connections, or fails with what it
/// said.
pub(super) fn start_sdk_server(
    netns: &Netns,
    script: &str,
    cert_dir: &std::path::Path,
    port: u16,
    extra: &[&str],
) -> TlsServer {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp_server")
        .join(script);
    let child = Command::new("ip")
        .args(["netns", "exec", &netns.name])
        .arg(mcp_python())
        .arg(path)
        .arg(netns.inside.to_string())
        .arg(port.to_string())
        .arg(cert_dir.join("cert.pem"))
        .arg(cert_dir.join("key.pem"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ip netns exec <the MCP SDK's python>");
    let mut server = TlsServer(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect_timeout(
        &(netns.inside, port).into(),
        Duration::from_millis(200),
    )
    .is_err()
    {
        if Instant::now() > deadline || server.0.try_wait().ok().flatten().is_some() {
            let _ = server.0.kill();
            panic!(
                "{script} did not start in the namespace: {}",
                stderr_of(&mut server.0)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

#[tokio::test]
async fn a_real_remote_server_is_initialised_listed_and_called_and_the_guard_still_holds() {
    let netns = Netns::create();
    let (certs, der) = self_signed(netns.inside);
    let _server = start_server(&netns, certs.path());
    // The client agentd uses for connections: it also follows same-origin redirects, so the
    // refusal below is the cross-origin rule's, not a blanket one.
    let client = GuardedClient::builder()
        .add_root_certificate_der(der)
        .follow_same_origin_redirects()
        .build()
        .unwrap();
    let base = format!("https://{}:{PORT}", netns.inside);

    let session = RemoteSession::open(
        client.clone(),
        &format!("{base}/mcp"),
        HeaderMap::new(),
        HTTP,
    )
    .await
    .unwrap_or_else(|e| panic!("initialize: {e}"));
    assert_eq!(session.server_name(), "netns-tools");
    let tools = session.list_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["add", "echo"]);
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.description, "Echo the text back.");
    assert_eq!(echo.input_schema["properties"]["text"]["type"], "string");

    let result = session
        .call_tool("echo", json!({"text": "from agentd"}))
        .await
        .unwrap();
    assert_eq!(
        result["content"][0]["text"], "echo: from agentd",
        "{result}"
    );
    assert_ne!(result["isError"], true);
    let result = session
        .call_tool("add", json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "5", "{result}");
    // A call the server cannot run comes back as its error, not as a result.
    let failed = session.call_tool("add", json!({"a": "two"})).await;
    match failed {
        Ok(result) => assert_eq!(result["isError"], true, "{result}"),
        Err(error) => assert!(matches!(error, RemoteError::Rpc { .. }), "{error}"),
    }

    // A server behind a key: refused with its challenge without it, served with it.
    let keyed = format!("{base}/keyed/mcp");
    let error = RemoteSession::open(client.clone(), &keyed, HeaderMap::new(), HTTP)
        .await
        .unwrap_err();
    assert_eq!(error.code(), "sign_in_required", "{error}");
    assert!(error.to_string().contains("realm=\"keyed\""), "{error}");
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("x-api-key"),
        HeaderValue::from_static("k-42-7f3c9a1e55d0"),
    );
    let session = RemoteSession::open(client.clone(), &keyed, headers, HTTP)
        .await
        .unwrap_or_else(|e| panic!("the keyed server with its key: {e}"));
    assert_eq!(session.list_tools().await.unwrap().len(), 2);

    // The older HTTP+SSE transport: the endpoint from the stream's first event, the answers on
    // the stream.
    let legacy = RemoteSession::open(
        client.clone(),
        &format!("{base}/legacy/sse"),
        HeaderMap::new(),
        Transport::Sse,
    )
    .await
    .unwrap_or_else(|e| panic!("the legacy SSE server: {e}"));
    assert_eq!(legacy.list_tools().await.unwrap().len(), 2);
    let result = legacy
        .call_tool("echo", json!({"text": "over sse"}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "echo: over sse", "{result}");
    let result = legacy
        .call_tool("add", json!({"a": 40, "b": 2}))
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "42", "{result}");
    // A stream whose endpoint is on another origin is refused.
    let error = RemoteSession::open(
        client.clone(),
        &format!("{base}/elsewhere/sse"),
        HeaderMap::new(),
        Transport::Sse,
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("another origin"), "{error}");

    // A 302 to the metadata address is never followed.
    let error = RemoteSession::open(
        client.clone(),
        &format!("{base}/redirect"),
        HeaderMap::new(),
        HTTP,
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), "redirect_refused", "{error}");
    assert!(error.to_string().contains("169.254.169.254"), "{error}");
    // Loopback and the metadata address themselves are refused before any connection.
    for url in [
        format!("https://127.0.0.1:{PORT}/mcp"),
        "https://169.254.169.254/mcp".to_owned(),
        "https://[::ffff:127.0.0.1]/mcp".to_owned(),
    ] {
        let error = RemoteSession::open(client.clone(), &url, HeaderMap::new(), HTTP)
            .await
            .unwrap_err();
        assert_eq!(error.code(), "address_refused", "{url}: {error}");
    }
}

/// A chat in server mode uses the project's connections: two connections named alike (each
/// its own session and tool names), one that wants a sign-in left out and reported, a remote
/// tool called and its result given to the model; once a connection is removed, its tools are
/// gone from the next turn and a call to them is refused.
#[test]
fn a_server_mode_chat_calls_a_connections_tool_and_a_removed_connection_is_gone() {
    use super::agent::{
        Model, api, calls, code_project, create_chat, of_kind, result_of, text, tool_names,
        tool_results, turn, user,
    };
    use super::harness::Stack;

    let netns = Netns::create();
    let (certs, der) = self_signed(netns.inside);
    let _server = start_server(&netns, certs.path());
    let model = Model::start();
    let (stack, _) = Stack::start_with_gateway_and(&format!(
        "outbound_root_certificates = [{:?}]\n\n{}",
        certs.path().join("cert.pem").to_str().unwrap(),
        model.config()
    ));
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[]);
    let base = format!("https://{}:{PORT}", netns.inside);
    let server_log = || {
        let client = GuardedClient::builder()
            .add_root_certificate_der(der.clone())
            .build()
            .unwrap();
        let body = super::harness::block_on(client.get(&format!("{base}/test/log")))
            .unwrap()
            .body;
        String::from_utf8(body.to_vec()).unwrap()
    };
    let add = |name: &str, url: String| {
        let (status, body) = api(
            &stack,
            &alice,
            "POST",
            "/v1/projects/app/mcp-connections",
            json!({"name": name, "url": url}),
        );
        assert_eq!(status, 201, "{body}");
        body
    };
    let first = add("Netns Tools", format!("{base}/mcp"));
    let twin = add("Netns Tools", format!("{base}/mcp?twin=1"));
    add("Locked", format!("{base}/keyed/mcp"));
    let (status, legacy) = api(
        &stack,
        &alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Legacy", "url": format!("{base}/legacy/sse"), "transport": "sse"}),
    );
    assert_eq!(status, 201, "{legacy}");
    assert_eq!(legacy["transport"], "sse");
    let l = legacy["tool_prefix"].as_str().unwrap().to_owned();
    // The same server with its key, named as a project secret that is not set yet.
    let (status, keyed) = api(
        &stack,
        &alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Keyed", "url": format!("{base}/keyed/mcp"),
               "headers": {"X-Api-Key": {"secret": "KEYED_API_KEY"}}}),
    );
    assert_eq!(status, 201, "{keyed}");
    let k = keyed["tool_prefix"].as_str().unwrap().to_owned();
    let (a, b) = (
        first["tool_prefix"].as_str().unwrap().to_owned(),
        twin["tool_prefix"].as_str().unwrap().to_owned(),
    );
    assert_ne!(a, b, "two connections named alike share a tool prefix");
    assert!(a.starts_with("mcp_netns_tools_"), "{a}");

    let chat = create_chat(&stack, &alice, "app");
    model.play(vec![
        calls(&[
            ("c1", &format!("{a}echo"), json!({"text": "via the first"})),
            ("c2", &format!("{b}add"), json!({"a": 20, "b": 22})),
            (
                "c5",
                &format!("{l}echo"),
                json!({"text": "over the old transport"}),
            ),
        ]),
        text("done"),
    ]);
    let events = turn(stack.port, &alice, &chat, "use the remote tools").unwrap();
    let requests = model.requests();
    let names = tool_names(&requests[0]);
    for expected in [
        format!("{a}echo"),
        format!("{a}add"),
        format!("{b}echo"),
        format!("{b}add"),
        "read_file".to_owned(),
    ] {
        assert!(
            names.contains(&expected),
            "{expected} not offered: {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n.starts_with("mcp_locked_")),
        "a connection that needs a sign-in was offered: {names:?}"
    );
    let description = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == format!("{a}echo"))
        .unwrap()["function"]["description"]
        .clone();
    assert_eq!(
        description,
        "[MCP server \"Netns Tools\"] Echo the text back."
    );
    // The ones left out are reported to the page and to the model: one wants a sign-in, the
    // other names a secret the project does not have.
    let unavailable = of_kind(&events, "connection_unavailable");
    let reported: Vec<(&str, &str)> = unavailable
        .iter()
        .map(|u| (u["name"].as_str().unwrap(), u["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        reported,
        [("Locked", "sign_in_required"), ("Keyed", "secret_missing")],
        "{events:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with(&k)), "{names:?}");
    let system = requests[0]["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("\"Locked\" (sign_in_required"), "{system}");
    assert!(system.contains("KEYED_API_KEY"), "{system}");

    assert_eq!(result_of(&events, "c1")["state"], "done", "{events:?}");
    assert_eq!(result_of(&events, "c2")["state"], "done", "{events:?}");
    assert_eq!(result_of(&events, "c5")["state"], "done", "{events:?}");
    // The collision test: the two connections named alike each had a session of their own,
    // made on their own URL, and each call went out on its connection's session.
    let log = server_log();
    let session_of = |query: &str| {
        log.lines()
            .find_map(|l| {
                l.strip_prefix("new session ")?
                    .strip_suffix(&format!(" for /mcp?{query}"))
            })
            .unwrap_or_else(|| panic!("no session made for /mcp?{query}: {log}"))
            .to_owned()
    };
    let (first_session, twin_session) = (session_of(""), session_of("twin=1"));
    assert_ne!(first_session, twin_session);
    assert!(
        log.contains(&format!("POST /mcp? session={first_session} tools/call")),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "POST /mcp?twin=1 session={twin_session} tools/call"
        )),
        "{log}"
    );
    assert!(
        !log.contains(&format!("POST /mcp? session={twin_session}"))
            && !log.contains(&format!("POST /mcp?twin=1 session={first_session}")),
        "a session was used by the other connection: {log}"
    );
    let results = tool_results(&requests[1]);
    assert_eq!(results[0].1["result"]["content"], "echo: via the first");
    assert_eq!(results[0].1["result"]["server"], "Netns Tools");
    assert_eq!(results[1].1["result"]["content"], "42");

    // Removed: the next turn has none of its tools, and a call to one is refused.
    let id = first["connection_id"].as_str().unwrap();
    let (status, body) = api(
        &stack,
        &alice,
        "DELETE",
        &format!("/v1/projects/app/mcp-connections/{id}"),
        Value::Null,
    );
    assert_eq!(status, 200, "{body}");
    // The secret set: sealed at rest, never answered back, sent as the header.
    let secret = "k-42-7f3c9a1e55d0";
    let (status, body) = api(
        &stack,
        &alice,
        "PUT",
        "/v1/projects/app/secrets/KEYED_API_KEY",
        json!({"value": secret}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains(secret), "{body}");
    let (_, listed) = api(
        &stack,
        &alice,
        "GET",
        "/v1/projects/app/secrets",
        Value::Null,
    );
    assert_eq!(listed["secrets"][0]["name"], "KEYED_API_KEY", "{listed}");
    assert!(!listed.to_string().contains(secret), "{listed}");
    model.clear();
    model.play(vec![
        calls(&[
            ("c3", &format!("{a}echo"), json!({"text": "still there?"})),
            ("c4", &format!("{k}echo"), json!({"text": "with the key"})),
        ]),
        text("ok"),
    ]);
    let events = turn(stack.port, &alice, &chat, "again").unwrap();
    let requests = model.requests();
    let names = tool_names(&requests[0]);
    assert!(!names.iter().any(|n| n.starts_with(&a)), "{names:?}");
    assert!(names.contains(&format!("{b}echo")), "{names:?}");
    let refused = result_of(&events, "c3");
    assert_eq!(refused["state"], "failed", "{refused}");
    assert!(
        refused["summary"].as_str().unwrap().contains("no tool"),
        "{refused}"
    );
    assert_eq!(result_of(&events, "c4")["state"], "done", "{events:?}");
    let results = tool_results(&requests[1]);
    let keyed_result = &results.iter().find(|(id, _)| id == "c4").unwrap().1;
    assert_eq!(keyed_result["result"]["content"], "echo: with the key");
    // Nothing in agentd's state holds the secret in clear, nor does any chat message (in
    // cluster mode, nor any of agentd's rows in PostgreSQL).
    assert_eq!(
        stack.agentd_state_holding(secret),
        None,
        "agentd's state holds the secret in clear"
    );
}

/// The same project's connection, working in server mode, is never offered to a turn bound to
/// a laptop folder, and a call to its tool there is an unknown tool; after agentd restarts, the
/// existing chat (unbound again) gets it from the stored facts alone.
#[test]
fn a_local_bound_turn_gets_none_of_the_connections_tools_and_a_restart_keeps_them() {
    use super::agent::{Setup, api, calls, create_chat, result_of, text, tool_names, turn};

    let netns = Netns::create();
    let (certs, _) = self_signed(netns.inside);
    let _server = start_server(&netns, certs.path());
    let mut setup = Setup::start_with(
        true,
        &format!(
            "outbound_root_certificates = [{:?}]",
            certs.path().join("cert.pem").to_str().unwrap()
        ),
    );
    let (status, connection) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        "/v1/projects/app/mcp-connections",
        json!({"name": "Tools", "url": format!("https://{}:{PORT}/mcp", netns.inside)}),
    );
    assert_eq!(status, 201, "{connection}");
    let echo = format!("{}echo", connection["tool_prefix"].as_str().unwrap());
    let chat = create_chat(&setup.stack, &setup.alice, "app");

    // Server mode: offered (so the exclusion below is the binding's doing).
    setup.model.play(vec![text("server mode")]);
    turn(setup.stack.port, &setup.alice, &chat, "hi").unwrap();
    assert!(tool_names(&setup.model.requests()[0]).contains(&echo));

    // Bound: exactly the local tools; the remote tool's name is unknown.
    let (status, body) = setup.bind(&chat);
    assert_eq!(status, 200, "{body}");
    setup.model.clear();
    setup.model.play(vec![
        calls(&[("b1", &echo, json!({"text": "from the laptop turn"}))]),
        text("bound"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "bound now").unwrap();
    for request in setup.model.requests() {
        assert_eq!(
            tool_names(&request),
            ["execute_shell_command", "diff_patch_workspace_file"]
        );
    }
    let refused = result_of(&events, "b1");
    assert_eq!(refused["state"], "failed", "{refused}");
    assert!(
        refused["summary"].as_str().unwrap().contains("no tool"),
        "{refused}"
    );

    // Unbound, agentd restarted: the stored project and person give the connection back.
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "DELETE",
        &format!("/v1/chats/{chat}/binding"),
        Value::Null,
    );
    assert_eq!(status, 200, "{body}");
    setup.stack.restart_agentd();
    setup.model.clear();
    setup.model.play(vec![
        calls(&[("r1", &echo, json!({"text": "after the restart"}))]),
        text("done"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "again").unwrap();
    assert_eq!(result_of(&events, "r1")["state"], "done", "{events:?}");
}

/// Names are checked at the address actually dialled: agentd runs with a resolver of the
/// test's (a DNS server on the namespace host, through a private `/etc/resolv.conf` in a mount
/// namespace of its own). A public-looking name that resolves to 127.0.0.1 is refused, and a
/// name that answers the namespace host first and 127.0.0.1 the next time (DNS rebinding) gets
/// its first request through and the next one refused: a listener on 127.0.0.1 at the same
/// port is never reached, not even through the proxy environment agentd is given.
#[test]
fn names_that_resolve_or_rebind_to_loopback_are_refused_at_the_dial() {
    use super::agent::{
        Model, api, code_project, create_chat, of_kind, text, tool_names, turn, user,
    };
    use super::harness::{Stack, free_port};
    use super::outbound::self_signed_for;

    let netns = Netns::create();
    let port = free_port();
    // The victim: a loopback listener on the port the names use.
    let victim = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    victim.set_nonblocking(true).unwrap();
    let (certs, _) = self_signed_for(
        netns.inside,
        &["rebind.example", "loop.example", "tools.example"],
    );
    let _server = start_server_on(&netns, certs.path(), port);
    let inside = netns.inside.to_string();
    let mut dns = Command::new("ip")
        .args(["netns", "exec", &netns.name, "python3"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_server/dns.py"))
        .arg(&inside)
        .arg(format!("tools.example={inside}"))
        .arg("loop.example=127.0.0.1")
        .arg(format!("rebind.example={inside},127.0.0.1"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 for the test's DNS server");
    let dns_out = dns.stdout.take().unwrap();
    let mut dns = TlsServer(dns);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(dns_out));
    match lines.next() {
        Some(Ok(line)) if line == "ready" => {}
        other => {
            let _ = dns.0.kill();
            panic!(
                "the DNS server did not start ({other:?}): {}",
                stderr_of(&mut dns.0)
            );
        }
    }
    // agentd's own resolver: the namespace host only, and no names from /etc/hosts but its own.
    let files = tempfile::tempdir().unwrap();
    let resolv = files.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        format!("nameserver {inside}\noptions timeout:2 attempts:1\n"),
    )
    .unwrap();
    let hosts = files.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
    let model = Model::start();
    let agentd_port = free_port();
    let config = format!(
        "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{agentd_port}\"\n\
         outbound_root_certificates = [{:?}]\n\n{}",
        certs.path().join("cert.pem").to_str().unwrap(),
        model.config()
    );
    let script = "mount --bind \"$1\" /etc/resolv.conf && mount --bind \"$2\" /etc/hosts && shift 2 && exec \"$@\"";
    // The proxy environment points at the loopback listener too: a client that honoured it
    // would reach it.
    let proxy = format!("http://127.0.0.1:{port}");
    let proxies: Vec<String> = [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
    ]
    .iter()
    .map(|name| format!("{name}={proxy}"))
    .collect();
    let mut wrapper: Vec<&std::ffi::OsStr> = vec!["env".as_ref()];
    wrapper.extend(proxies.iter().map(std::ffi::OsStr::new));
    wrapper.extend::<[&std::ffi::OsStr; 10]>([
        "unshare".as_ref(),
        "--mount".as_ref(),
        "--propagation".as_ref(),
        "private".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        script.as_ref(),
        "sh".as_ref(),
        resolv.as_os_str(),
        hosts.as_os_str(),
    ]);
    let stack = Stack::start_wrapped(agentd_port, &config, &wrapper);
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[]);
    let mut prefixes = std::collections::HashMap::new();
    for name in ["tools", "loop", "rebind"] {
        let (status, body) = api(
            &stack,
            &alice,
            "POST",
            "/v1/projects/app/mcp-connections",
            json!({"name": name, "url": format!("https://{name}.example:{port}/mcp")}),
        );
        assert_eq!(status, 201, "{body}");
        prefixes.insert(name, body["tool_prefix"].as_str().unwrap().to_owned());
    }
    let chat = create_chat(&stack, &alice, "app");
    model.play(vec![text("checked")]);
    let events = turn(stack.port, &alice, &chat, "which servers work?").unwrap();
    // The name that resolves to the namespace host works: the resolver is really in use.
    let names = tool_names(&model.requests()[0]);
    assert!(
        names.contains(&format!("{}echo", prefixes["tools"])),
        "{names:?} {events:?}"
    );
    let unavailable: std::collections::HashMap<String, (String, String)> =
        of_kind(&events, "connection_unavailable")
            .iter()
            .map(|u| {
                (
                    u["name"].as_str().unwrap().to_owned(),
                    (
                        u["code"].as_str().unwrap().to_owned(),
                        u["message"].as_str().unwrap().to_owned(),
                    ),
                )
            })
            .collect();
    for name in ["loop", "rebind"] {
        let (code, message) = &unavailable
            .get(name)
            .unwrap_or_else(|| panic!("{name} was not refused: {events:?}"));
        assert_eq!(code, "address_refused", "{name}: {message}");
        assert!(message.contains("127.0.0.1"), "{name}: {message}");
    }
    // Rebinding got exactly one answer through (the first); the loopback listener never saw
    // a connection.
    assert!(
        matches!(victim.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection reached the loopback listener"
    );
    let _ = dns.0.kill();
    let _ = dns.0.wait();
    let queries: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        queries
            .iter()
            .filter(|q| q.starts_with("A rebind.example"))
            .count()
            >= 2,
        "{queries:?}"
    );
}
