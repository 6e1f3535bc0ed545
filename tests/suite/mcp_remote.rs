//! agentd's client for remote MCP servers (`agentworks_agent::mcp_remote`) against a real one:
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

use agentworks_agent::mcp_remote::{RemoteError, RemoteSession};
use agentworks_support::outbound::GuardedClient;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::json;

use super::harness::mcp_python;
use super::outbound::{Netns, TlsServer, self_signed, stderr_of};

const PORT: u16 = 8443;

/// The SDK's server in the namespace; waits until it accepts connections.
fn start_server(netns: &Netns, cert_dir: &std::path::Path) -> TlsServer {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_server/netns_tools.py");
    let child = Command::new("ip")
        .args(["netns", "exec", &netns.name])
        .arg(mcp_python())
        .arg(script)
        .arg(netns.inside.to_string())
        .arg(PORT.to_string())
        .arg(cert_dir.join("cert.pem"))
        .arg(cert_dir.join("key.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ip netns exec <the MCP SDK's python>");
    let mut server = TlsServer(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect_timeout(
        &(netns.inside, PORT).into(),
        Duration::from_millis(200),
    )
    .is_err()
    {
        if Instant::now() > deadline || server.0.try_wait().ok().flatten().is_some() {
            let _ = server.0.kill();
            panic!(
                "the MCP server in the namespace did not start: {}",
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

    let session = RemoteSession::open(client.clone(), &format!("{base}/mcp"), HeaderMap::new())
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
    let error = RemoteSession::open(client.clone(), &keyed, HeaderMap::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), "sign_in_required", "{error}");
    assert!(error.to_string().contains("realm=\"keyed\""), "{error}");
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("x-api-key"),
        HeaderValue::from_static("k-42"),
    );
    let session = RemoteSession::open(client.clone(), &keyed, headers)
        .await
        .unwrap_or_else(|e| panic!("the keyed server with its key: {e}"));
    assert_eq!(session.list_tools().await.unwrap().len(), 2);

    // A 302 to the metadata address is never followed.
    let error = RemoteSession::open(
        client.clone(),
        &format!("{base}/redirect"),
        HeaderMap::new(),
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
        let error = RemoteSession::open(client.clone(), &url, HeaderMap::new())
            .await
            .unwrap_err();
        assert_eq!(error.code(), "address_refused", "{url}: {error}");
    }
}
