//! The ACP driver against the real OpenCode (the version pinned in tests/opencode), talking to
//! a scripted chat-completions server on loopback.
//!
//! Each test writes the driver's files (`AcpDriver::files`) into a fresh runtime, starts the
//! native `opencode` binary with the driver's arguments and environment (`AcpDriver::launch`)
//! plus the runtime's (`HOME` and the XDG directories), and runs `acp::converse` on its stdin
//! and stdout. Unsandboxed: the sandbox is the turn's business (turn.rs; the suite's
//! `runnerd_opencode` runs it through runnerd).
//!
//! A missing install fails the test with the command that fixes it; it never passes silently.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::acp::{AcpAgent, AcpApi, AcpDriver, AcpError, AcpOptions, converse};
use agentworks_runner::driver::{CliDriver, Conversation, TurnSetup};
use serde_json::json;
use support::chat_completions::{Reply, ScriptedChat};
use support::opencode_binary;
use tokio_util::sync::CancellationToken;

const MODEL: &str = "agentworks-test-model";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const GUIDANCE: &str = "Guidance marker 7f3a: use project/ for files.";

fn options() -> AcpOptions {
    AcpOptions {
        args: vec!["acp".to_owned()],
        agent: AcpAgent::OpenCode,
        api: AcpApi::ChatCompletions,
    }
}

/// One chat's runtime, kept across its turns.
struct Runtime {
    _root: tempfile::TempDir,
    dir: PathBuf,
}

impl Runtime {
    fn new() -> Runtime {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("runtime");
        for sub in [
            "home/.config",
            "home/.cache",
            "home/.local/share",
            "home/.local/state",
            "tmp",
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        Runtime { _root: root, dir }
    }

    fn env(&self) -> Vec<(&'static str, PathBuf)> {
        let home = self.dir.join("home");
        vec![
            ("HOME", home.clone()),
            ("TMPDIR", self.dir.join("tmp")),
            ("XDG_CONFIG_HOME", home.join(".config")),
            ("XDG_CACHE_HOME", home.join(".cache")),
            ("XDG_DATA_HOME", home.join(".local/share")),
            ("XDG_STATE_HOME", home.join(".local/state")),
        ]
    }
}

struct Run {
    events: Vec<TurnEvent>,
    outcome: Result<(), AcpError>,
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
}

/// Runs one turn: `stop` stops it once the model has its first request.
async fn run_turn(
    runtime: &Runtime,
    server: &ScriptedChat,
    resume: Option<&str>,
    prompt: &str,
    capability: &str,
    stop: bool,
) -> Run {
    let base_url = server.base_url();
    let options = options();
    let setup = TurnSetup {
        model: MODEL,
        gateway_base_url: &base_url,
        bridge_command: None,
        builder: false,
        bound: false,
        runtime_dir: &runtime.dir,
        guidance: GUIDANCE,
        acp: Some(&options),
    };
    let driver = AcpDriver;
    for file in driver.files(&setup).unwrap() {
        let path = runtime.dir.join(&file.path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, file.content).unwrap();
    }
    let launch = driver.launch(&setup, capability, resume).unwrap();
    let Conversation::Acp(session) = driver.conversation(&setup, resume) else {
        panic!("the ACP driver's conversation is ACP")
    };
    let mut child = tokio::process::Command::new(opencode_binary())
        .args(&launch.args)
        .current_dir(&runtime.dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .envs(runtime.env())
        .envs(launch.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut stderr = child.stderr.take().unwrap();
    let stderr_text = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    let cancel = CancellationToken::new();
    let stopper = async {
        let waiting = std::time::Instant::now();
        while stop && waiting.elapsed() < RUN_TIMEOUT {
            if !server.requests().is_empty() {
                cancel.cancel();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let mut events = Vec::new();
    let (outcome, ()) = {
        let mut emit = |event: TurnEvent| events.push(event);
        tokio::join!(
            tokio::time::timeout(
                RUN_TIMEOUT,
                converse(stdout, stdin, &session, prompt, &cancel, &mut emit),
            ),
            stopper
        )
    };
    let outcome = outcome.expect("the conversation ran longer than 60 s");
    // Its input is closed: OpenCode exits on its own (a cancelled one is ended).
    let status = match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(status) => Some(status.unwrap()),
        Err(_) => {
            child.kill().await.unwrap();
            None
        }
    };
    let stderr = stderr_text.await.unwrap();
    eprintln!(
        "opencode exited {status:?}; outcome {outcome:?}; events {events:#?}\nstderr: {stderr}"
    );
    Run { events, outcome }
}

fn mentions(request: &support::chat_completions::RecordedRequest, needle: &str) -> bool {
    request
        .messages()
        .iter()
        .any(|m| m.to_string().contains(needle))
}

#[tokio::test]
async fn a_text_turn_with_the_session_the_capability_and_no_other_traffic() {
    let server = ScriptedChat::start(vec![Reply::Text("Hello from the script.".into())])
        .await
        .unwrap();
    let runtime = Runtime::new();
    let run = run_turn(&runtime, &server, None, "Say hello.", "cap-text-123", false).await;

    run.outcome.as_ref().unwrap();
    assert!(
        run.session().is_some_and(|s| !s.is_empty()),
        "{:?}",
        run.events
    );
    assert_eq!(run.texts(), ["Hello from the script."]);
    assert!(
        !run.events
            .iter()
            .any(|e| matches!(e, TurnEvent::ToolCall { .. })),
        "{:?}",
        run.events
    );

    // One model request (no title request), to the gateway, with the capability only.
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let request = &requests[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(request.header("authorization"), Some("Bearer cap-text-123"));
    assert_eq!(request.body["model"], json!(MODEL));
    assert_eq!(request.body["stream"], json!(true));
    assert_eq!(request.body["stream_options"]["include_usage"], json!(true));
    assert!(mentions(request, "Say hello."));
    // The generated instructions reach the model.
    assert!(
        mentions(request, "Guidance marker 7f3a"),
        "{:#?}",
        request.messages()
    );
    // Its own shell is among its tools (server mode).
    assert!(request.function_names().contains(&"bash".to_owned()));

    // Nothing was installed from npm into its config directory, and the key is in no file.
    let config_dir = runtime.dir.join("home/.config/opencode");
    assert!(!config_dir.join("node_modules/@opencode-ai").exists());
    assert!(!runtime.dir.join("home/.npm").exists());
    assert_no_file_holds(&runtime.dir, "cap-text-123");
}

#[tokio::test]
async fn a_native_tool_call_is_allowed_in_server_mode_and_its_output_goes_back() {
    let server = ScriptedChat::start(vec![
        Reply::tool(
            "bash",
            "call_cat",
            json!({"command": "cat hello.txt", "description": "Shows hello.txt"}),
        ),
        Reply::Text("The file greets you.".into()),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new();
    std::fs::write(runtime.dir.join("hello.txt"), "hello from the file\n").unwrap();
    let run = run_turn(
        &runtime,
        &server,
        None,
        "Read hello.txt.",
        "cap-tool",
        false,
    )
    .await;

    run.outcome.as_ref().unwrap();
    let call = run
        .events
        .iter()
        .find_map(|e| match e {
            TurnEvent::ToolCall {
                call_id,
                tool,
                command,
            } => Some((call_id.clone(), tool.clone(), command.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool call in {:?}", run.events));
    assert_eq!(call.0, "call_cat");
    assert_eq!(call.1, "bash");
    assert_eq!(call.2, "cat hello.txt");
    let result = run
        .events
        .iter()
        .find_map(|e| match e {
            TurnEvent::ToolResult {
                call_id,
                exit_code,
                output,
                refused: false,
                failed: false,
            } if *call_id == call.0 => Some((*exit_code, output.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool result in {:?}", run.events));
    assert_eq!(result.0, Some(0));
    assert!(result.1.contains("hello from the file"), "{}", result.1);
    assert_eq!(run.texts(), ["The file greets you."]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert!(mentions(&requests[1], "hello from the file"));
}

#[tokio::test]
async fn the_next_turn_loads_the_session_and_its_history_is_not_replayed_as_events() {
    let server = ScriptedChat::start(vec![
        Reply::Text("First answer.".into()),
        Reply::Text("Second answer.".into()),
    ])
    .await
    .unwrap();
    let runtime = Runtime::new();
    let first = run_turn(&runtime, &server, None, "First question.", "cap-1", false).await;
    first.outcome.as_ref().unwrap();
    let session = first.session().unwrap().to_owned();

    let second = run_turn(
        &runtime,
        &server,
        Some(&session),
        "Second question.",
        "cap-2",
        false,
    )
    .await;
    second.outcome.as_ref().unwrap();
    assert_eq!(second.session(), Some(session.as_str()));
    // Only this turn's text: the loaded session's replay is not an event.
    assert_eq!(second.texts(), ["Second answer."]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    // The second request carries the first exchange: the session went on.
    assert!(mentions(&requests[1], "First question."));
    assert!(mentions(&requests[1], "First answer."));
    assert!(mentions(&requests[1], "Second question."));
    assert_eq!(requests[1].header("authorization"), Some("Bearer cap-2"));
}

#[tokio::test]
async fn stop_cancels_the_prompt() {
    let server = ScriptedChat::start(vec![Reply::Stall("Thinking".into())])
        .await
        .unwrap();
    let runtime = Runtime::new();
    let started = std::time::Instant::now();
    let run = run_turn(&runtime, &server, None, "Take your time.", "cap-stop", true).await;
    assert!(
        matches!(run.outcome, Err(AcpError::Cancelled)),
        "{:?}",
        run.outcome
    );
    // The stalled answer did not hold the turn: cancel plus its grace.
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.requests().len(), 1);
}

/// No regular file below `dir` contains `needle`.
fn assert_no_file_holds(dir: &Path, needle: &str) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).unwrap();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                    "{} holds the capability",
                    entry.path().display()
                );
            }
        }
    }
}
