//! The guarded outbound client (`agentworks_support::outbound`) against real servers on real
//! sockets: a loopback server is never reached, and the allowed path works for real against a
//! server in a network namespace with a public-looking address (11.x.y.2: 11/8 is not refused),
//! where redirects, oversized bodies and stalls are refused, and the proxy environment is
//! ignored.
//!
//! Needs root and iproute2 (`ip netns`); without them the tests fail and say so.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentworks_support::outbound::{GuardedClient, OutboundError};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// A loopback listener the test binds itself, so on port 0: the kernel's pick is ours at once,
/// and it is in the ephemeral range, never one of the ports `harness::free_port` hands other
/// tests' daemons (whose clients would otherwise knock on it). No daemon is told this port.
fn loopback_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

/// Fails if a connection reached `listener`.
fn assert_never_connected(listener: &TcpListener, what: &str) {
    listener.set_nonblocking(true).unwrap();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("{what}: a connection arrived from {peer}"),
        Err(e) => panic!("{what}: accept failed: {e}"),
    }
}

#[tokio::test]
async fn a_server_on_loopback_is_never_reached() {
    let (listener, port) = loopback_listener();
    let http = GuardedClient::builder().allow_plain_http().build().unwrap();
    let https = GuardedClient::new().unwrap();
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://0x7f.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://[::1]:{port}/"),
    ] {
        for client in [&http, &https] {
            let error = client.get(&url).await.unwrap_err();
            let refused = matches!(error, OutboundError::RefusedAddress { .. })
                || (std::ptr::eq(client, &https)
                    && matches!(error, OutboundError::NotHttps { .. }));
            assert!(refused, "{url}: {error}");
        }
        let https_url = url.replacen("http://", "https://", 1);
        let error = https.get(&https_url).await.unwrap_err();
        assert!(
            matches!(error, OutboundError::RefusedAddress { .. }),
            "{https_url}: {error}"
        );
    }
    // `localhost` resolves to loopback; it is refused by name, before DNS.
    for url in [
        format!("http://localhost:{port}/"),
        format!("http://LocalHost.:{port}/"),
        format!("http://a.localhost:{port}/"),
    ] {
        let error = http.get(&url).await.unwrap_err();
        assert!(
            matches!(error, OutboundError::RefusedHost { .. }),
            "{url}: {error}"
        );
        assert!(error.to_string().contains("localhost"), "{error}");
    }
    assert_never_connected(&listener, "the loopback server");
}

/// A network namespace joined to this one by a veth pair: this side 11.a.b.1/30, the
/// namespace side 11.a.b.2/30. Deleted on drop, whatever the test did.
pub(super) struct Netns {
    pub(super) name: String,
    root_link: String,
    ns_link: String,
    pub(super) inside: Ipv4Addr,
}

fn ip(args: &[&str]) {
    let output = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip` (install iproute2): {e}"));
    assert!(
        output.status.success(),
        "`ip {}` failed (these tests need root and iproute2): {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Netns {
    pub(super) fn create() -> Netns {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the outbound tests need root to create a network namespace (`ip netns add`)"
        );
        let tag: u32 = rand::random::<u32>() & 0x00ff_fffc;
        let (a, b, c) = ((tag >> 16) as u8, (tag >> 8) as u8, tag as u8);
        let name = format!("awtest-out-{}-{tag:06x}", std::process::id());
        let root_link = format!("awo{tag:06x}r");
        let ns_link = format!("awo{tag:06x}n");
        let netns = Netns {
            name: name.clone(),
            root_link: root_link.clone(),
            ns_link: ns_link.clone(),
            inside: Ipv4Addr::new(11, a, b, c + 2),
        };
        let outside = format!("11.{a}.{b}.{}/30", c + 1);
        let inside = format!("{}/30", netns.inside);
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &root_link, "type", "veth", "peer", "name", &ns_link,
        ]);
        ip(&["link", "set", &ns_link, "netns", &name]);
        ip(&["addr", "add", &outside, "dev", &root_link]);
        ip(&["link", "set", &root_link, "up"]);
        ip(&["-n", &name, "addr", "add", &inside, "dev", &ns_link]);
        ip(&["-n", &name, "link", "set", &ns_link, "up"]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        netns
    }

    /// Also gives our end of the link the IPv6 address `outside` and the namespace's end
    /// `inside`, both in one `/prefix` (no duplicate address detection: usable at once).
    fn add_ipv6(&self, outside: std::net::Ipv6Addr, inside: std::net::Ipv6Addr, prefix: u8) {
        let (outside, inside) = (format!("{outside}/{prefix}"), format!("{inside}/{prefix}"));
        ip(&[
            "-6",
            "addr",
            "add",
            &outside,
            "dev",
            &self.root_link,
            "nodad",
        ]);
        ip(&[
            "-n",
            &self.name,
            "-6",
            "addr",
            "add",
            &inside,
            "dev",
            &self.ns_link,
            "nodad",
        ]);
    }

    /// A TCP listener bound inside the namespace: a thread joins it, binds, and hands the
    /// socket back (a socket stays in the namespace it was made in).
    fn listen(&self, port: u16) -> tokio::net::TcpListener {
        self.listen_at(SocketAddr::from((self.inside, port)))
    }

    /// [`Netns::listen`] at `address` (one of the namespace's).
    fn listen_at(&self, address: SocketAddr) -> tokio::net::TcpListener {
        let path = format!("/run/netns/{}", self.name);
        let listener = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap();
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            TcpListener::bind(address).unwrap()
        })
        .join()
        .unwrap();
        listener.set_nonblocking(true).unwrap();
        tokio::net::TcpListener::from_std(listener).unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and with it ours.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.root_link])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The namespace's HTTP server: a route per behaviour. Counts the connections it accepted.
fn serve(listener: tokio::net::TcpListener, origin: String) -> Arc<AtomicUsize> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let origin = origin.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<_>| {
                    let origin = origin.clone();
                    async move { Ok::<_, Infallible>(route(request, &origin).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    accepted
}

async fn route<B>(request: Request<B>, origin: &str) -> Response<Full<Bytes>> {
    let redirect = |to: String| {
        Response::builder()
            .status(StatusCode::FOUND)
            .header("location", to)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    match request.uri().path() {
        "/hello" => Response::new(Full::new(Bytes::from(format!(
            "hello, host {}",
            request.headers()["host"].to_str().unwrap()
        )))),
        "/here" => redirect(format!("{origin}/hello")),
        "/relative" => redirect("/hello".into()),
        "/elsewhere" => redirect("http://127.0.0.1:9/".into()),
        "/loop" => redirect(format!("{origin}/loop")),
        "/big" => Response::new(Full::new(Bytes::from(vec![b'x'; 2 << 20]))),
        "/stall" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Response::new(Full::new(Bytes::new()))
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()))
            .unwrap(),
    }
}

/// Issue 42, item 14: a host whose network has a local-use NAT64 (64:ff9b:1::/48) or an
/// IPv4 translator (::ffff:0:0:0/96) reaches private IPv4 hosts through those IPv6 addresses.
/// Here the namespace host answers at one address of each (routed to it, as a translator
/// would be): a plain connection gets there, and the guarded client refuses both before
/// connecting. Before the fix both were public addresses to it and it fetched from them.
#[tokio::test]
async fn addresses_behind_a_local_nat64_or_an_ipv4_translator_are_refused() {
    use std::net::Ipv6Addr;
    let netns = Netns::create();
    let [_, a, b, c] = netns.inside.octets();
    let nat64 = |host: u16| {
        Ipv6Addr::new(
            0x64,
            0xff9b,
            1,
            u16::from(a) << 8 | u16::from(b),
            u16::from(c),
            0,
            0,
            host,
        )
    };
    // ::ffff:0:a.b.c.d for the link's two IPv4 addresses, one /126 as the IPv4 /30.
    let translated =
        |v4: Ipv4Addr| Ipv6Addr::from((0xffff_0000_u128 << 32) | u128::from(u32::from(v4)));
    let outside_v4 = Ipv4Addr::from(u32::from(netns.inside) - 1);
    netns.add_ipv6(nat64(1), nat64(2), 64);
    netns.add_ipv6(translated(outside_v4), translated(netns.inside), 126);
    let client = GuardedClient::builder().allow_plain_http().build().unwrap();
    for (inside, range) in [
        (nat64(2), "local-use NAT64"),
        (translated(netns.inside), "IPv4-translated"),
    ] {
        let address = SocketAddr::from((inside, 8080));
        let accepted = serve(netns.listen_at(address), format!("http://{address}"));
        // The address is reachable: an unguarded connection lands.
        let direct = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(address),
        )
        .await;
        assert!(
            matches!(direct, Ok(Ok(_))),
            "{address} is not reachable: {direct:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while accepted.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "{address}: never accepted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let error = client
            .get(&format!("http://{address}/hello"))
            .await
            .expect_err("the guarded client fetched from a translated address");
        assert!(
            matches!(error, OutboundError::RefusedAddress { .. }),
            "{range}: {error}"
        );
        assert!(error.to_string().contains(range), "{range}: {error}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "{range}: the guarded client connected"
        );
    }
}

#[tokio::test]
async fn the_allowed_path_works_and_stays_bounded() {
    let netns = Netns::create();
    let origin = format!("http://{}:8080", netns.inside);
    let accepted = serve(netns.listen(8080), origin.clone());
    let client = GuardedClient::builder().allow_plain_http().build().unwrap();

    let response = client.get(&format!("{origin}/hello")).await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        response.body,
        format!("hello, host {}:8080", netns.inside).as_bytes()
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    let response = client
        .post(&format!("{origin}/nothing"), "application/json", "{}")
        .await
        .unwrap();
    assert_eq!(response.status, StatusCode::NOT_FOUND);

    // Without the https opt-in the same server is refused before connecting.
    let before = accepted.load(Ordering::SeqCst);
    let error = GuardedClient::new()
        .unwrap()
        .get(&format!("{origin}/hello"))
        .await
        .unwrap_err();
    assert!(matches!(error, OutboundError::NotHttps { .. }), "{error}");
    // https to a server that speaks plain HTTP: the handshake fails, nothing is accepted as
    // a response.
    let error = GuardedClient::new()
        .unwrap()
        .get(&format!("https://{}:8080/hello", netns.inside))
        .await
        .unwrap_err();
    assert!(matches!(error, OutboundError::Tls { .. }), "{error}");
    assert_eq!(accepted.load(Ordering::SeqCst), before + 1);

    // Redirects: refused by default, even to the same origin; a refused one names where it
    // pointed.
    for path in ["/here", "/elsewhere"] {
        let error = client.get(&format!("{origin}{path}")).await.unwrap_err();
        match error {
            OutboundError::Redirect { status, location } => {
                assert_eq!(status, StatusCode::FOUND);
                assert!(!location.is_empty());
            }
            other => panic!("{path}: {other}"),
        }
    }
    // With same-origin redirects: followed within the origin, refused across, at most 3.
    let following = GuardedClient::builder()
        .allow_plain_http()
        .follow_same_origin_redirects()
        .build()
        .unwrap();
    for path in ["/here", "/relative"] {
        let response = following.get(&format!("{origin}{path}")).await.unwrap();
        assert_eq!(response.status, StatusCode::OK, "{path}");
        assert!(response.body.starts_with(b"hello"), "{path}");
    }
    let error = following
        .get(&format!("{origin}/elsewhere"))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, OutboundError::Redirect { location, .. } if location == "http://127.0.0.1:9/"),
        "{error}"
    );
    let before = accepted.load(Ordering::SeqCst);
    let error = following.get(&format!("{origin}/loop")).await.unwrap_err();
    assert!(matches!(error, OutboundError::Redirect { .. }), "{error}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before + 4,
        "1 request + 3 redirects"
    );

    // A body over the limit (the default 1 MiB; the server sends 2 MiB).
    let error = client.get(&format!("{origin}/big")).await.unwrap_err();
    assert!(
        matches!(error, OutboundError::TooLarge { limit } if limit == 1 << 20),
        "{error}"
    );
    let roomy = GuardedClient::builder()
        .allow_plain_http()
        .max_body_bytes(4 << 20)
        .build()
        .unwrap();
    assert_eq!(
        roomy
            .get(&format!("{origin}/big"))
            .await
            .unwrap()
            .body
            .len(),
        2 << 20
    );

    // A server that never answers hits the whole-request timeout.
    let impatient = GuardedClient::builder()
        .allow_plain_http()
        .request_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let error = impatient.get(&format!("{origin}/stall")).await.unwrap_err();
    assert!(matches!(error, OutboundError::Timeout { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A server that accepts and never speaks TLS hits the handshake timeout.
    let silent = netns.listen(8443);
    let impatient_tls = GuardedClient::builder()
        .tls_handshake_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let error = impatient_tls
        .get(&format!("https://{}:8443/", netns.inside))
        .await
        .unwrap_err();
    assert!(
        matches!(error, OutboundError::Timeout { stage, .. } if stage.contains("TLS")),
        "{error}"
    );
    drop(silent);
}

/// The proxy environment is never read: a child test process with `HTTP_PROXY` and friends
/// pointing at a loopback listener fetches from the namespace directly, and the "proxy" is
/// never connected to.
#[tokio::test]
async fn the_proxy_environment_is_ignored() {
    // In the child this test starts (below), the fetch itself.
    if let Ok(url) = std::env::var("AWTEST_OUTBOUND_URL") {
        return fetch_with_the_proxy_environment_set(&url).await;
    }
    let netns = Netns::create();
    let origin = format!("http://{}:8080", netns.inside);
    let accepted = serve(netns.listen(8080), origin.clone());
    let (proxy, proxy_port) = loopback_listener();
    let proxy_url = format!("http://127.0.0.1:{proxy_port}");

    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "suite::outbound::the_proxy_environment_is_ignored",
            "--nocapture",
        ])
        .env("AWTEST_OUTBOUND_URL", format!("{origin}/hello"));
    for variable in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        child.env(variable, &proxy_url);
    }
    child.env_remove("NO_PROXY").env_remove("no_proxy");
    let output = child.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the child fetch failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "fetched directly");
    assert_never_connected(&proxy, "the proxy");
}

/// The child's half of [`the_proxy_environment_is_ignored`]: it runs in a process whose
/// environment names a proxy (set only there, so no other test's client sees it).
async fn fetch_with_the_proxy_environment_set(url: &str) {
    assert!(std::env::var("HTTP_PROXY").is_ok());
    let client = GuardedClient::builder().allow_plain_http().build().unwrap();
    let response = client.get(url).await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert!(response.body.starts_with(b"hello"));
}

/// A self-signed certificate for `ip` made with the `openssl` command: (PEM dir, DER bytes).
pub(super) fn self_signed(ip: Ipv4Addr) -> (tempfile::TempDir, Vec<u8>) {
    self_signed_for(ip, &[])
}

/// [`self_signed`] for `ip` and the DNS `names`.
pub(super) fn self_signed_for(ip: Ipv4Addr, names: &[&str]) -> (tempfile::TempDir, Vec<u8>) {
    let mut alt_names = format!("IP:{ip}");
    for name in names {
        alt_names.push_str(&format!(",DNS:{name}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("req.cnf");
    std::fs::write(
        &config,
        format!(
            "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n\
             [dn]\nCN = awtest-outbound\n\
             [ext]\nsubjectAltName = {alt_names}\nbasicConstraints = critical, CA:FALSE\n\
             keyUsage = digitalSignature\nextendedKeyUsage = serverAuth\n"
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `openssl` (install openssl): {e}"));
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-config",
        "req.cnf",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "cert.pem",
        "-days",
        "2",
    ]);
    run(&[
        "x509", "-in", "cert.pem", "-outform", "der", "-out", "cert.der",
    ]);
    let der = std::fs::read(dir.path().join("cert.der")).unwrap();
    (dir, der)
}

/// Python's HTTPS server inside the namespace, killed on drop.
pub(super) struct TlsServer(pub(super) std::process::Child);

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const TLS_SERVER: &str = r#"
import http.server, ssl, sys
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello over TLS, host " + self.headers["Host"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((sys.argv[1], 8443), Hello)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
"#;

#[tokio::test]
async fn https_is_verified_against_the_trusted_roots() {
    use std::io::BufRead;
    let netns = Netns::create();
    let (dir, der) = self_signed(netns.inside);
    let mut child = Command::new("ip")
        .args(["netns", "exec", &netns.name, "python3", "-c", TLS_SERVER])
        .arg(netns.inside.to_string())
        .arg(dir.path().join("cert.pem"))
        .arg(dir.path().join("key.pem"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 for the test's HTTPS server");
    let stdout = child.stdout.take().unwrap();
    let mut server = TlsServer(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    if line.trim() != "ready" {
        let _ = server.0.kill();
        let output = stderr_of(&mut server.0);
        panic!("the HTTPS server did not start: {output}");
    }
    let url = format!("https://{}:8443/hello", netns.inside);

    // The webpki roots alone do not trust a self-signed certificate.
    let error = GuardedClient::new().unwrap().get(&url).await.unwrap_err();
    assert!(matches!(error, OutboundError::Tls { .. }), "{error}");

    let trusting = GuardedClient::builder()
        .add_root_certificate_der(der)
        .build()
        .unwrap();
    let response = trusting.get(&url).await.unwrap();
    assert_eq!(response.status, StatusCode::OK);
    assert_eq!(
        response.body,
        format!("hello over TLS, host {}:8443", netns.inside).as_bytes()
    );
    drop(server);
}

/// What a finished child wrote to stderr.
pub(super) fn stderr_of(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let _ = child.wait();
    let mut text = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut text);
    }
    text
}
