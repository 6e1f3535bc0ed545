//! An OAuth client named by its Client ID Metadata Document (an https `client_id`), end to end
//! over real HTTP against a real agentd: the document is served over https by a host in a
//! network namespace at a public-looking address (11.x.y.2, `suite::outbound`'s [`Netns`])
//! with a certificate an internal CA issued, and agentd trusts that CA only through
//! `[agentd] outbound_root_certificates`. The client is authorized, consented to through the
//! console's session API and redeems its code as a public client; a document whose
//! `client_id` is not its URL, a document URL that redirects, the same host for an agentd
//! without the CA configured, and any document for an agentd whose configured CA file is
//! missing are each refused with the error page (which says only that the document could not
//! be used, never what its address answered).
//!
//! Needs root and iproute2 (`ip netns`), openssl and python3; without them the test fails and
//! says so.

use std::io::BufRead;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::harness::{Stack, free_port};
use super::oauth::{
    REDIRECT, allow, authorize, challenge_of, consent_view, exchange, mcp_status, setup_on, start,
};
use super::outbound::{Netns, TlsServer, self_signed, stderr_of};

/// The HTTPS server in the namespace: each path of the routes file (JSON: path → status,
/// headers, body) answered as written, anything else 404; every requested path appended to
/// the log file as it arrives.
const DOCUMENT_SERVER: &str = r#"
import http.server, json, ssl, sys
address, port, cert, key, routes_file, log_file = sys.argv[1:7]
with open(routes_file) as f:
    routes = json.load(f)
class Documents(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log_file, "a") as log:
            log.write(self.path + "\n")
        route = routes.get(self.path, {"status": 404})
        body = route.get("body", "").encode()
        self.send_response(route["status"])
        for name, value in route.get("headers", {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer((address, int(port)), Documents)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
"#;

/// Run `openssl` in `dir`; panics with its stderr when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `openssl` (install openssl): {e}"));
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An internal CA (`ca.pem`, `ca.key`) and a server certificate it issued for `ip`
/// (`cert.pem`, `key.pem`), all in `dir`.
pub(super) fn internal_ca(dir: &Path, ip: Ipv4Addr) {
    std::fs::write(
        dir.join("ca.cnf"),
        "[req]\ndistinguished_name = dn\nx509_extensions = ext\nprompt = no\n\
         [dn]\nCN = awtest internal CA\n\
         [ext]\nbasicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n\
         subjectKeyIdentifier = hash\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("server.cnf"),
        format!(
            "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = awtest-cimd\n\
             [ext]\nsubjectAltName = IP:{ip}\nbasicConstraints = critical, CA:FALSE\n\
             keyUsage = digitalSignature\nextendedKeyUsage = serverAuth\n\
             authorityKeyIdentifier = keyid\n"
        ),
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-config", "ca.cnf"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-new", "-config", "server.cnf"];
    csr.extend(ec);
    csr.extend(["-keyout", "key.pem", "-out", "server.csr"]);
    openssl(dir, &csr);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.cnf",
            "-extensions",
            "ext",
            "-out",
            "cert.pem",
        ],
    );
}

/// [`DOCUMENT_SERVER`] on port 443 of the namespace, serving `routes`; its log is `log`.
pub(super) fn serve_documents(netns: &Netns, dir: &Path, routes: Value, log: &Path) -> TlsServer {
    let routes_file = dir.join("routes.json");
    std::fs::write(&routes_file, routes.to_string()).unwrap();
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns.name,
            "python3",
            "-c",
            DOCUMENT_SERVER,
        ])
        .arg(netns.inside.to_string())
        .arg("443")
        .arg(dir.join("cert.pem"))
        .arg(dir.join("key.pem"))
        .arg(&routes_file)
        .arg(log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
        panic!(
            "the HTTPS document server did not start: {}",
            stderr_of(&mut server.0)
        );
    }
    server
}

/// The paths the document server was asked for so far.
pub(super) fn requested(log: &Path) -> Vec<String> {
    match std::fs::read_to_string(log) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", log.display()),
    }
}

/// An agentd on a free port whose config is `agentd_extra` in `[agentd]`.
pub(super) fn agentd_with(agentd_extra: &str) -> Stack {
    let port = free_port();
    Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\
             {agentd_extra}\n"
        ),
    )
}

/// A complete authorization request for `client`: (status, Location, page).
fn authorize_client(stack: &Stack, client: &str) -> (u16, String, String) {
    let challenge = challenge_of(&"c".repeat(43));
    let resource = stack.mcp_url();
    authorize(
        stack,
        &[
            ("response_type", "code"),
            ("client_id", client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", "st-cimd"),
            ("resource", &resource),
            ("scope", "workflows:read"),
        ],
    )
}

/// Refused with the error page (never a redirect back to the client) saying `says`.
fn assert_refused(answer: (u16, String, String), says: &str, what: &str) {
    let (status, location, page) = answer;
    assert_eq!(status, 400, "{what}: {location} {page}");
    assert!(location.is_empty(), "{what} redirected to {location}");
    assert!(page.contains(says), "{what}: expected {says:?} in {page}");
}

#[test]
fn a_client_named_by_its_metadata_document_on_an_internal_ca_signs_in_and_the_rest_is_refused() {
    let netns = Netns::create();
    let dir = tempfile::tempdir().unwrap();
    internal_ca(dir.path(), netns.inside);
    // The configured file holds two certificates: an unrelated self-signed one, then the CA.
    let (other, _) = self_signed(Ipv4Addr::new(11, 0, 0, 1));
    let bundle = dir.path().join("roots.pem");
    std::fs::write(
        &bundle,
        [
            std::fs::read(other.path().join("cert.pem")).unwrap(),
            std::fs::read(dir.path().join("ca.pem")).unwrap(),
        ]
        .concat(),
    )
    .unwrap();

    let origin = format!("https://{}", netns.inside);
    let client = format!("{origin}/client.json");
    let document = json!({
        "client_id": client,
        "client_name": "Doc App",
        "redirect_uris": [REDIRECT],
    })
    .to_string();
    let json_type = json!({"Content-Type": "application/json"});
    let log = dir.path().join("requests.log");
    let _server = serve_documents(
        &netns,
        dir.path(),
        json!({
            "/client.json": {"status": 200, "headers": json_type, "body": document},
            // The same document at another URL: its client_id is not where it was fetched.
            "/wrong.json": {"status": 200, "headers": json_type, "body": document},
            "/moved.json": {"status": 302, "headers": {"Location": "/client.json"}},
        }),
        &log,
    );

    let s = setup_on(agentd_with(&format!(
        "outbound_root_certificates = [{:?}]",
        bundle.display().to_string()
    )));
    // The authorization request: the document is fetched and the person is sent to consent.
    let verifier = "d".repeat(50);
    let id = start(&s, &client, "workflows:read", &verifier);
    assert_eq!(requested(&log), ["/client.json"]);
    let view = consent_view(&s, &id);
    assert_eq!(view["client_name"], "Doc App");
    assert_eq!(view["redirect_host"], "127.0.0.1:49151");
    let code = allow(&s, &id, json!({"allow": true, "projects": [s.flows]}));
    // The code is redeemed by the public client: its URL as client_id, no secret.
    let (status, tokens) = exchange(&s, &client, &code, &verifier);
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["scope"], "workflows:read");
    assert!(tokens["refresh_token"].is_string(), "{tokens}");
    let access = tokens["access_token"].as_str().unwrap();
    assert_eq!(mcp_status(&s, access), 200);

    // A document whose client_id is not the URL it was fetched from. (The page never says
    // what the address answered, only that the document could not be used.)
    assert_refused(
        authorize_client(&s.stack, &format!("{origin}/wrong.json")),
        "could not be used",
        "a document naming another client_id",
    );
    // A document URL that redirects: refused, and the redirect is not followed.
    let before = requested(&log).len();
    assert_refused(
        authorize_client(&s.stack, &format!("{origin}/moved.json")),
        "could not be used",
        "a redirecting document URL",
    );
    assert_eq!(requested(&log)[before..], ["/moved.json"]);

    // The same host for an agentd that does not trust the internal CA: the TLS handshake
    // fails and no document is read.
    let before = requested(&log).len();
    let untrusting = agentd_with("");
    assert_refused(
        authorize_client(&untrusting, &client),
        "could not be used",
        "without the CA configured",
    );
    assert_eq!(requested(&log).len(), before, "no request got past TLS");
    // A configured file agentd cannot read: it logs that and fetches no document at all
    // (rather than fetching with the public roots alone).
    let missing = dir.path().join("missing.pem");
    let misconfigured = agentd_with(&format!(
        "outbound_root_certificates = [{:?}, {:?}]",
        bundle.display().to_string(),
        missing.display().to_string()
    ));
    assert_refused(
        authorize_client(&misconfigured, &client),
        "cannot be fetched by this server",
        "with an unreadable root certificate file",
    );
    assert_eq!(requested(&log).len(), before, "nothing was fetched");
}
