//! The Claude Code driver against the real Claude Code (the version pinned in
//! tests/claude/package.json), talking to a scripted Messages API server on loopback.
//!
//! Each test writes the driver's files (`ClaudeDriver::files`) into a fresh runtime directory,
//! runs the native `claude` binary with the driver's arguments and environment
//! (`ClaudeDriver::launch`), the prompt on stdin, a clean environment and a temp `HOME`, the
//! runtime as its cwd, and feeds its stdout through `EventParser`. Unsandboxed: the sandbox is the
//! turn's business (turn.rs). The bridge is a fake: a small stdio MCP server (Python, standard
//! library only) offering `echo`, which records the environment it was started with.
//!
//! A missing install fails the test with the command that fixes it; it never passes silently.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::bridge;
use agentworks_runner::claude::{ClaudeDriver, EventParser};
use agentworks_runner::driver::{CliDriver, TurnSetup};
use serde_json::{Value, json};
use support::claude_binary;
use support::messages::{RecordedRequest, Reply, ScriptedMessages};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const MODEL: &str = "agentworks-test-model";
const GUIDANCE: &str = "You work in a runtime; the project is project/. Guidance marker 7f3a.";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// One chat's runtime: its directory (the CLI's cwd) and a private `HOME`.
struct Runtime {
    _root: tempfile::TempDir,
    dir: PathBuf,
    home: PathBuf,
    /// The fake bridge's executable, when the turn has a bridge.
    bridge: Option<PathBuf>,
    /// Where the fake bridge writes what it saw.
    bridge_log: PathBuf,
}

impl Runtime {
    fn new(with_bridge: bool) -> Self {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("runtime");
        let home = root.path().join("home");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&home).unwrap();
        let bridge_log = root.path().join("bridge.log");
        let bridge = with_bridge.then(|| fake_bridge(root.path(), &bridge_log));
        Self {
            _root: root,
            dir,
            home,
            bridge,
            bridge_log,
        }
    }

    fn setup<'a>(&'a self, base_url: &'a str, bound: bool) -> TurnSetup<'a> {
        TurnSetup {
            model: MODEL,
            gateway_base_url: base_url,
            bridge_command: self.bridge.as_deref().and_then(Path::to_str),
            builder: false,
            bound,
            runtime_dir: &self.dir,
            guidance: GUIDANCE,
            acp: None,
        }
    }

    /// What the fake bridge logged: one JSON object a line.
    fn bridge_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.bridge_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A stdio MCP server with one tool, `echo {text}`, answering `echo: <text>`; it logs its
/// environment's bridge variables and every message it gets to `log`.
fn fake_bridge(dir: &Path, log: &Path) -> PathBuf {
    let python = std::env::var_os("AGENTWORKS_MCP_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| {
            ["/usr/bin/python3", "/usr/local/bin/python3"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .expect("the fake bridge needs a Python 3: install python3 or set AGENTWORKS_MCP_PYTHON");
    let script = format!(
        r#"#!{python}
import json, os, sys
log = open({log:?}, "a")
def note(value):
    log.write(json.dumps(value) + "\n"); log.flush()
note({{"env": {{k: os.environ.get(k) for k in ("{url}", "{token}")}}}})
for line in sys.stdin:
    message = json.loads(line)
    note({{"message": message}})
    if "id" not in message:
        continue
    method = message.get("method")
    if method == "initialize":
        result = {{"protocolVersion": message["params"]["protocolVersion"],
                  "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "fake-bridge", "version": "1"}}}}
    elif method == "tools/list":
        result = {{"tools": [{{"name": "echo", "description": "Echoes text.",
                   "inputSchema": {{"type": "object", "properties": {{"text": {{"type": "string"}}}},
                                   "required": ["text"]}}}}]}}
    elif method == "tools/call":
        text = message["params"]["arguments"].get("text", "")
        result = {{"content": [{{"type": "text", "text": "echo: " + text}}]}}
    else:
        print(json.dumps({{"jsonrpc": "2.0", "id": message["id"],
                          "error": {{"code": -32601, "message": "no " + str(method)}}}}), flush=True)
        continue
    print(json.dumps({{"jsonrpc": "2.0", "id": message["id"], "result": result}}), flush=True)
"#,
        python = python.display(),
        log = log.display().to_string(),
        url = bridge::URL_ENV,
        token = bridge::TOKEN_ENV,
    );
    let path = dir.join("fake-bridge");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// What one run printed, as the turn's events (`finish` included), its exit status and the
/// arguments it ran with.
struct Run {
    events: Vec<TurnEvent>,
    exit_code: Option<i32>,
    args: Vec<String>,
}

impl Run {
    fn session(&self) -> Option<&str> {
        self.events.iter().find_map(|e| match e {
            TurnEvent::Session { session_id } => Some(session_id.as_str()),
            _ => None,
        })
    }

    fn texts(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|e| match e {
                TurnEvent::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn after(&self, flag: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == flag)?;
        self.args.get(i + 1).map(String::as_str)
    }

    /// The (tool, command) of the call `id` and its result's (exit code, output).
    fn call(&self, id: &str) -> ((String, String), (Option<i32>, String)) {
        let call = self.events.iter().find_map(|e| match e {
            TurnEvent::ToolCall {
                call_id,
                tool,
                command,
            } if call_id == id => Some((tool.clone(), command.clone())),
            _ => None,
        });
        let result = self.events.iter().find_map(|e| match e {
            TurnEvent::ToolResult {
                call_id,
                exit_code,
                output,
                ..
            } if call_id == id => Some((*exit_code, output.clone())),
            _ => None,
        });
        match (call, result) {
            (Some(call), Some(result)) => (call, result),
            _ => panic!("no call {id} with its result in {:#?}", self.events),
        }
    }
}

const BRIDGE_URL: &str = "http://127.0.0.1:9/v1/bridge";

async fn run_claude(
    runtime: &Runtime,
    server: &ScriptedMessages,
    bound: bool,
    resume: Option<&str>,
    prompt: &str,
    capability: &str,
) -> Run {
    let base_url = server.base_url();
    let setup = runtime.setup(&base_url, bound);
    for file in ClaudeDriver.files(&setup).unwrap() {
        let path = runtime.dir.join(&file.path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, file.content).unwrap();
    }
    let launch = ClaudeDriver.launch(&setup, capability, resume).unwrap();
    let mut child = tokio::process::Command::new(claude_binary())
        .args(&launch.args)
        .current_dir(&runtime.dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &runtime.home)
        .env("LANG", "C.UTF-8")
        .envs(launch.env)
        // What the turn sets for the bridge (turn.rs), a fresh token each run.
        .env(bridge::URL_ENV, BRIDGE_URL)
        .env(bridge::TOKEN_ENV, format!("bridge-token-of-{capability}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(prompt.as_bytes()).await.unwrap();
    drop(stdin);
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();

    let mut parser = EventParser::new();
    let run = async {
        let mut events = Vec::new();
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            events.extend(parser.line(&line));
        }
        let mut err = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut err)
            .await
            .unwrap();
        let status = child.wait().await.unwrap();
        events.extend(parser.finish(status.code()));
        (events, status.code(), err)
    };
    let (events, exit_code, stderr) = tokio::time::timeout(RUN_TIMEOUT, run)
        .await
        .expect("claude ran longer than 60 s");
    eprintln!(
        "claude {:?} exited {exit_code:?}; events {events:#?}\nstderr: {stderr}",
        launch.args
    );
    Run {
        events,
        exit_code,
        args: launch.args,
    }
}

fn text(reply: &str) -> Reply {
    Reply::Text(reply.to_owned())
}

/// Whether any message of `request` carries `needle`.
fn mentions(request: &RecordedRequest, needle: &str) -> bool {
    request
        .messages()
        .iter()
        .any(|m| m.to_string().contains(needle))
}

/// Every request went to the Messages API: nothing else (telemetry, `/api/hello`, token counts).
fn only_messages(requests: &[RecordedRequest]) {
    for r in requests {
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/messages"),
            "{requests:#?}"
        );
    }
}

#[tokio::test]
async fn a_text_answer_with_the_session_the_guidance_and_the_capability() {
    let server = ScriptedMessages::start(vec![text("Hello from the script.")])
        .await
        .unwrap();
    let runtime = Runtime::new(false);
    let run = run_claude(&runtime, &server, false, None, "Say hello.", "cap-text-123").await;

    assert_eq!(run.exit_code, Some(0));
    // The session is the one the driver named.
    let session = run.session().expect("a Session event");
    assert_eq!(Some(session), run.after("--session-id"));
    assert_eq!(run.texts(), ["Hello from the script."]);
    assert!(
        !run.events
            .iter()
            .any(|e| matches!(e, TurnEvent::Error { .. } | TurnEvent::ToolCall { .. })),
        "{:?}",
        run.events
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    only_messages(&requests);
    let request = &requests[0];
    // The capability, as x-api-key, is the credential; nothing else.
    assert_eq!(request.header("x-api-key"), Some("cap-text-123"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(request.body["model"], json!(MODEL));
    assert_eq!(request.body["stream"], json!(true));
    assert!(mentions(request, "Say hello."));
    // The generated instructions are in the system prompt (--bare reads no CLAUDE.md itself).
    assert!(
        request.body["system"]
            .to_string()
            .contains("Guidance marker 7f3a"),
        "{}",
        request.body["system"]
    );
    // Not bound: Claude Code's native tools are offered.
    let tools = request.tool_names();
    assert!(tools.contains(&"Bash".to_owned()), "{tools:?}");
}

#[tokio::test]
async fn a_bridge_tool_call_reaches_the_bridge_with_this_runs_token() {
    let server = ScriptedMessages::start(vec![
        Reply::mcp("bridge", "echo", "toolu_echo", json!({"text": "ping"})),
        text("The bridge answered."),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new(true);
    let run = run_claude(&runtime, &server, false, None, "Echo ping.", "cap-bridge").await;

    assert_eq!(run.exit_code, Some(0));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    only_messages(&requests);
    let tools = requests[0].tool_names();
    assert!(tools.contains(&"mcp__bridge__echo".to_owned()), "{tools:?}");

    let ((tool, command), (exit_code, output)) = run.call("toolu_echo");
    assert_eq!(tool, "bridge.echo");
    assert_eq!(command, r#"{"text":"ping"}"#);
    assert_eq!((exit_code, output.as_str()), (None, "echo: ping"));
    assert_eq!(run.texts(), ["The bridge answered."]);
    // The answer went back to the model as the call's result.
    let result = requests[1]
        .messages()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|block| block["type"] == json!("tool_result"))
        .expect("a tool_result in the second request");
    assert_eq!(result["tool_use_id"], json!("toolu_echo"));
    assert!(
        result["content"].to_string().contains("echo: ping"),
        "{result}"
    );

    // The bridge got the URL and this run's token, expanded from Claude Code's environment;
    // the config file names the variables and holds neither value.
    let lines = runtime.bridge_lines();
    let env = lines
        .iter()
        .find_map(|l| l.get("env"))
        .expect("the bridge started");
    assert_eq!(env[bridge::URL_ENV], json!(BRIDGE_URL));
    assert_eq!(env[bridge::TOKEN_ENV], json!("bridge-token-of-cap-bridge"));
    let config = std::fs::read_to_string(runtime.dir.join("claude/mcp.json")).unwrap();
    assert!(!config.contains("bridge-token-of"), "{config}");
    assert!(!config.contains("127.0.0.1:9"), "{config}");
    let called = lines
        .iter()
        .any(|l| l["message"]["method"] == json!("tools/call"));
    assert!(called, "{lines:#?}");
}

#[tokio::test]
async fn a_second_run_resumes_the_session() {
    let server = ScriptedMessages::start(vec![
        text("First answer, about zebras."),
        text("Second answer."),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new(false);
    let first = run_claude(
        &runtime,
        &server,
        false,
        None,
        "Remember the word zebra.",
        "cap-1",
    )
    .await;
    assert_eq!(first.exit_code, Some(0));
    let session = first.session().expect("a Session event").to_owned();

    let second = run_claude(
        &runtime,
        &server,
        false,
        Some(&session),
        "Which word?",
        "cap-2",
    )
    .await;
    assert_eq!(second.exit_code, Some(0));
    assert_eq!(second.after("--resume"), Some(session.as_str()));
    assert_eq!(second.session(), Some(session.as_str()));
    assert_eq!(second.texts(), ["Second answer."]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let resumed = &requests[1];
    // The resumed request carries the earlier conversation, then the new prompt; and each
    // run's own capability.
    assert!(mentions(resumed, "Remember the word zebra."));
    assert!(mentions(resumed, "First answer, about zebras."));
    assert!(mentions(resumed, "Which word?"));
    assert_eq!(resumed.header("x-api-key"), Some("cap-2"));
}

#[tokio::test]
async fn a_bound_run_offers_only_the_bridge_and_refuses_a_native_tool() {
    let marker = tempfile::tempdir().unwrap();
    let made = marker.path().join("made-by-bash");
    let server = ScriptedMessages::start(vec![
        Reply::bash("toolu_bash", &format!("touch {}", made.display())),
        text("No shell here."),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new(true);
    let run = run_claude(&runtime, &server, true, None, "Make a file.", "cap-bound").await;

    assert_eq!(run.exit_code, Some(0));
    assert_eq!(run.after("--tools"), Some(""));
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for request in &requests {
        // The bridge's tools, and not one native tool (Bash, Edit, Read, Write, …).
        assert_eq!(request.tool_names(), ["mcp__bridge__echo"]);
    }
    // Asked for directly, the shell is refused, and nothing ran.
    let ((tool, _), (exit_code, output)) = run.call("toolu_bash");
    assert_eq!(tool, "shell");
    assert_eq!(exit_code, None);
    assert!(output.contains("No such tool available: Bash"), "{output}");
    assert!(!made.exists());
    assert_eq!(run.texts(), ["No shell here."]);
}

#[tokio::test]
async fn settings_left_in_the_runtime_do_not_steer_the_next_run() {
    let server = ScriptedMessages::start(vec![
        Reply::bash("toolu_env", "env | grep -c PLANTED_BY_CLI; true"),
        text("Done."),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new(false);
    // What a CLI could have written into its runtime on an earlier turn: project and user
    // settings with an environment of their own.
    for file in [".claude/settings.json", "claude/settings.json"] {
        let path = runtime.dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, r#"{"env": {"PLANTED_BY_CLI": "1"}}"#).unwrap();
    }
    let run = run_claude(&runtime, &server, false, None, "Show it.", "cap-env").await;
    assert_eq!(run.exit_code, Some(0));
    let (_, (exit_code, output)) = run.call("toolu_env");
    assert_eq!((exit_code, output.trim()), (Some(0), "0"));
}

#[tokio::test]
async fn a_refused_key_ends_the_run_soon_with_the_failure() {
    let server = ScriptedMessages::start(vec![Reply::RefuseKey])
        .await
        .unwrap();
    let runtime = Runtime::new(false);
    let started = std::time::Instant::now();
    let run = run_claude(&runtime, &server, false, None, "hi", "cap-refused").await;
    assert_ne!(run.exit_code, Some(0));
    let failure = run
        .events
        .iter()
        .find_map(|e| match e {
            TurnEvent::Error { code, message } => Some((code.clone(), message.clone())),
            _ => None,
        })
        .expect("a failure");
    assert_eq!(failure.0, "cli_failed");
    assert!(failure.1.starts_with("Claude Code: "), "{}", failure.1);
    assert!(run.texts().is_empty(), "{:?}", run.texts());
    // Two retries, not ten with a backoff of minutes.
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_capabilities_stay_out_of_the_commands_claude_runs() {
    let server = ScriptedMessages::start(vec![
        Reply::bash("toolu_env", "env; echo end"),
        Reply::mcp(
            "bridge",
            "echo",
            "toolu_echo",
            json!({"text": "still here"}),
        ),
        text("Done."),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new(true);
    let run = run_claude(
        &runtime,
        &server,
        false,
        None,
        "Show the environment.",
        "cap-secret-value",
    )
    .await;
    assert_eq!(run.exit_code, Some(0));
    let (_, (_, output)) = run.call("toolu_env");
    // The command ran (its environment is there) without either capability or the bridge's URL.
    assert!(output.contains("CLAUDE_CONFIG_DIR="), "{output}");
    assert!(!output.contains("cap-secret-value"), "{output}");
    assert!(!output.contains("ANTHROPIC_API_KEY"), "{output}");
    assert!(!output.contains("bridge-token-of"), "{output}");
    assert!(!output.contains(bridge::URL_ENV), "{output}");
    // The bridge, which Claude Code starts itself, still has them.
    let (_, (_, echoed)) = run.call("toolu_echo");
    assert_eq!(echoed, "echo: still here");
    let env = runtime
        .bridge_lines()
        .into_iter()
        .find_map(|l| l.get("env").cloned())
        .expect("the bridge started");
    assert_eq!(
        env[bridge::TOKEN_ENV],
        json!("bridge-token-of-cap-secret-value")
    );
}
