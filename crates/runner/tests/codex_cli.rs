//! The Codex driver against the real Codex CLI (the version pinned in tests/codex/package.json),
//! talking to a scripted Responses API server on loopback.
//!
//! Each test writes `config_toml(..)` to a fresh `CODEX_HOME`, runs the native `codex` binary with
//! `args(..)` (plus `--strict-config`, so every key the driver writes must be one Codex knows),
//! the prompt on stdin, a clean environment and a temp `HOME`, and feeds its stdout through
//! `EventParser`. Unsandboxed: the sandbox is the turn's business (turn.rs).
//!
//! A missing install fails the test with the command that fixes it; it never passes silently.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::codex::{CodexConfig, EventParser, args, config_toml};
use serde_json::json;
use support::codex_binary;
use support::responses::{RecordedRequest, Reply, ScriptedResponses, USAGE_PER_REPLY};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const KEY_ENV: &str = "AGENTWORKS_MODEL_KEY";
const MODEL: &str = "agentworks-test-model";
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// One turn's private directories.
struct Turn {
    _root: tempfile::TempDir,
    codex_home: PathBuf,
    home: PathBuf,
    cwd: PathBuf,
}

impl Turn {
    fn new(server: &ScriptedResponses) -> Self {
        Self::with_native_tools(server, true)
    }

    /// `native_tools` false: the config of a chat bound to a laptop folder.
    fn with_native_tools(server: &ScriptedResponses, native_tools: bool) -> Self {
        let root = tempfile::tempdir().unwrap();
        let codex_home = root.path().join("codex-home");
        let home = root.path().join("home");
        let cwd = root.path().join("cwd");
        for dir in [&codex_home, &home, &cwd] {
            std::fs::create_dir(dir).unwrap();
        }
        let base_url = server.base_url();
        let config = config_toml(&CodexConfig {
            model: MODEL,
            gateway_base_url: &base_url,
            key_env: KEY_ENV,
            bridge: None,
            builder: false,
            bound: !native_tools,
        })
        .unwrap();
        std::fs::write(codex_home.join("config.toml"), config).unwrap();
        Self {
            _root: root,
            codex_home,
            home,
            cwd,
        }
    }
}

/// What one run printed, as the turn's events (`finish` included), and its exit status.
struct Run {
    events: Vec<TurnEvent>,
    exit_code: Option<i32>,
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

    fn usage(&self) -> Vec<(u64, u64)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                TurnEvent::Usage {
                    input_tokens,
                    output_tokens,
                } => Some((*input_tokens, *output_tokens)),
                _ => None,
            })
            .collect()
    }
}

async fn run_codex(
    turn: &Turn,
    resume: Option<&str>,
    prompt: &str,
    capability: &str,
    mut parser: EventParser,
) -> Run {
    let mut arguments = args(resume);
    // Refuse any config key 0.171 does not know (after `exec`, before its subcommand).
    arguments.insert(1, "--strict-config".to_owned());
    let mut child = tokio::process::Command::new(codex_binary())
        .args(&arguments)
        .current_dir(&turn.cwd)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &turn.home)
        .env("CODEX_HOME", &turn.codex_home)
        .env(KEY_ENV, capability)
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
        .expect("codex ran longer than 30 s");
    eprintln!("codex {arguments:?} exited {exit_code:?}; events {events:#?}\nstderr: {stderr}");
    Run { events, exit_code }
}

fn text(reply: &str) -> Reply {
    Reply::Text(reply.to_owned())
}

/// Whether any `input` item of `request` carries `needle` in its text.
fn input_mentions(request: &RecordedRequest, needle: &str) -> bool {
    request
        .input()
        .iter()
        .any(|item| item.to_string().contains(needle))
}

#[tokio::test]
async fn a_text_answer_with_the_session_usage_and_the_capability() {
    let server = ScriptedResponses::start(vec![text("Hello from the script.")])
        .await
        .unwrap();
    let turn = Turn::new(&server);
    let run = run_codex(
        &turn,
        None,
        "Say hello.",
        "cap-text-123",
        EventParser::new(),
    )
    .await;

    assert_eq!(run.exit_code, Some(0));
    let session = run.session().expect("a Session event");
    assert!(!session.is_empty());
    assert_eq!(run.texts(), ["Hello from the script."]);
    assert_eq!(run.usage(), [USAGE_PER_REPLY]);
    assert!(
        !run.events
            .iter()
            .any(|e| matches!(e, TurnEvent::Error { .. } | TurnEvent::ToolCall { .. })),
        "{:?}",
        run.events
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    let request = &requests[0];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/v1/responses")
    );
    // The capability from the env_key variable, and nothing else, is the credential.
    assert_eq!(request.header("authorization"), Some("Bearer cap-text-123"));
    assert_eq!(request.body["model"], json!(MODEL));
    assert_eq!(request.body["stream"], json!(true));
    assert!(input_mentions(request, "Say hello."));
}

#[tokio::test]
async fn a_shell_call_runs_and_its_output_goes_back_to_the_model() {
    let server = ScriptedResponses::start(vec![
        Reply::FunctionCall {
            name: "exec_command".to_owned(),
            call_id: "call_cat".to_owned(),
            arguments: json!({"cmd": "cat hello.txt"}),
        },
        text("The file greets you."),
    ])
    .await
    .unwrap();
    let turn = Turn::new(&server);
    std::fs::write(turn.cwd.join("hello.txt"), "hello from the file\n").unwrap();
    let run = run_codex(
        &turn,
        None,
        "What does hello.txt say?",
        "cap-shell",
        EventParser::new(),
    )
    .await;

    assert_eq!(run.exit_code, Some(0));
    // Codex 0.171's shell tool is the function `exec_command` with a required `cmd`.
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let shell = requests[0]
        .tool("exec_command")
        .unwrap_or_else(|| panic!("no exec_command in {:?}", requests[0].tool_names()));
    assert_eq!(shell["type"], json!("function"));
    assert_eq!(shell["parameters"]["required"], json!(["cmd"]));

    let (call_id, command) = run
        .events
        .iter()
        .find_map(|e| match e {
            TurnEvent::ToolCall {
                call_id,
                tool,
                command,
            } if tool == "shell" => Some((call_id.clone(), command.clone())),
            _ => None,
        })
        .expect("a shell ToolCall");
    assert!(command.contains("cat hello.txt"), "{command}");
    assert!(!command.contains('\n'));
    let result = run.events.iter().find_map(|e| match e {
        TurnEvent::ToolResult {
            call_id: id,
            exit_code,
            output,
            ..
        } if *id == call_id => Some((*exit_code, output.clone())),
        _ => None,
    });
    assert_eq!(result, Some((Some(0), "hello from the file\n".to_owned())));
    assert_eq!(run.texts(), ["The file greets you."]);
    // Two model requests in the turn, counted together.
    assert_eq!(
        run.usage(),
        [(2 * USAGE_PER_REPLY.0, 2 * USAGE_PER_REPLY.1)]
    );

    // The command's output went back to the model as the call's output.
    let output = requests[1]
        .input()
        .iter()
        .find(|item| item["type"] == json!("function_call_output"))
        .expect("a function_call_output in the second request");
    assert_eq!(output["call_id"], json!("call_cat"));
    assert!(
        output["output"].to_string().contains("hello from the file"),
        "{output}"
    );
}

#[tokio::test]
async fn a_second_turn_resumes_the_thread() {
    let server = ScriptedResponses::start(vec![
        text("First answer, about zebras."),
        text("Second answer."),
    ])
    .await
    .unwrap();
    let turn = Turn::new(&server);
    let first = run_codex(
        &turn,
        None,
        "Remember the word zebra.",
        "cap-1",
        EventParser::new(),
    )
    .await;
    assert_eq!(first.exit_code, Some(0));
    let thread = first.session().expect("a Session event").to_owned();
    let (input, output) = first.usage()[0];

    // Codex reports the thread's running total; the baseline makes it this turn's.
    let second = run_codex(
        &turn,
        Some(&thread),
        "Which word?",
        "cap-2",
        EventParser::with_usage_baseline(input, output),
    )
    .await;
    assert_eq!(second.exit_code, Some(0));
    assert_eq!(second.session(), Some(thread.as_str()));
    assert_eq!(second.texts(), ["Second answer."]);
    assert_eq!(second.usage(), [USAGE_PER_REPLY]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let resumed = &requests[1];
    // The resumed request carries the earlier conversation: the first prompt and its answer,
    // before the new prompt; and each run's own capability.
    assert!(input_mentions(resumed, "Remember the word zebra."));
    assert!(input_mentions(resumed, "First answer, about zebras."));
    assert!(input_mentions(resumed, "Which word?"));
    assert_eq!(resumed.header("authorization"), Some("Bearer cap-2"));
    assert_eq!(resumed.header("thread-id"), Some(thread.as_str()));
}

#[tokio::test]
async fn the_capability_stays_out_of_the_commands_codex_runs() {
    let server = ScriptedResponses::start(vec![
        Reply::FunctionCall {
            name: "exec_command".to_owned(),
            call_id: "call_env".to_owned(),
            arguments: json!({"cmd": "env"}),
        },
        text("Done."),
    ])
    .await
    .unwrap();
    let turn = Turn::new(&server);
    let run = run_codex(
        &turn,
        None,
        "Show the environment.",
        "cap-secret-value",
        EventParser::new(),
    )
    .await;
    assert_eq!(run.exit_code, Some(0));
    let output = run
        .events
        .iter()
        .find_map(|e| match e {
            TurnEvent::ToolResult { output, .. } => Some(output.clone()),
            _ => None,
        })
        .expect("the env command's result");
    // The command ran (its environment is there) without the capability in it.
    assert!(output.contains("CODEX_HOME="), "{output}");
    assert!(!output.contains(KEY_ENV), "{output}");
    assert!(!output.contains("cap-secret-value"), "{output}");
}

#[tokio::test]
async fn a_bound_chats_config_offers_no_native_tool_that_reaches_files_or_runs_commands() {
    // The tools that read or change the server's files, run commands here, or start agents
    // that could: none of them may be offered when the chat's hands are on a laptop.
    const NATIVE: &[&str] = &[
        "exec_command",
        "write_stdin",
        "shell",
        "apply_patch",
        "view_image",
        "multi_agent_v1",
        "web_search",
    ];
    for native_tools in [true, false] {
        let server = ScriptedResponses::start(vec![text("ok")]).await.unwrap();
        let turn = Turn::with_native_tools(&server, native_tools);
        let run = run_codex(&turn, None, "Hi.", "cap-bound", EventParser::new()).await;
        assert_eq!(run.exit_code, Some(0));
        let offered = server.requests()[0].tool_names();
        let native: Vec<&str> = NATIVE
            .iter()
            .copied()
            .filter(|n| offered.iter().any(|o| o == n))
            .collect();
        if native_tools {
            // The same run with the default config offers the shell: the check can fail.
            assert!(native.contains(&"exec_command"), "{offered:?}");
        } else {
            assert!(native.is_empty(), "a bound config still offers {native:?}");
        }
    }
}
