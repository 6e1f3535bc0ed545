//! What runnerd adds to a coding CLI's turn, as ratios in one run against the same scripted
//! model: the time from the turn's start to the CLI's first model request, through runnerd (the
//! request on runnerd.sock → the runtime prepared, the project pinned, the capability opened,
//! the config written, the sandbox's launcher, Codex, the model gateway) against the bare
//! `codex exec` started by hand with the same config pointing straight at the model (goal: at
//! most 150 ms more at p50); and a bridge tool call (`execute_shell_command` of `true`: the
//! CLI's `agentworks-mcpbridge` over stdio, runnerd's loopback endpoint, a fresh sandbox of the
//! turn's mode) against the model loop's direct call of the same tool (the same command through
//! the same sandbox, in process: what agentd's tool executor does; goal: at most 5 ms more at
//! p50). The bridge is driven as the CLI would: a provider whose "CLI" only holds the turn open
//! leaves its environment (the bridge's URL and the turn's token) in its runtime, and this
//! process starts the bridge with it.
//!
//! Both run the real release binaries: runnerd (`cargo bench` builds it) and the pinned Codex
//! (`tests/codex`, `npm ci --ignore-scripts` there). The model is the tests' scripted Responses
//! server on loopback, answering each request with one short text. The two kinds of start
//! alternate, so both see the same machine.
//!
//! Claude Code's rows ([`claude_rows`], its own runnerd with a `claude` provider, the pinned
//! `tests/claude` against the tests' scripted Messages server): the same time to the first model
//! request, through runnerd against the bare `claude` started by hand with the files, arguments
//! and environment the driver makes (the bridge in its `mcp.json` too, since Claude Code starts
//! its MCP servers before it asks the model); and a tool call as Claude Code makes it, the time
//! from the model's `tool_use` answer to Claude Code's next request with the result, for the
//! bridge's `execute_shell_command` of `true` (the bridge, runnerd, a fresh sandbox) against its
//! own `Bash` of `true` (in the turn's sandbox, no bridge), both through runnerd.
//!
//! OpenCode's rows ([`opencode_rows`], its own runnerd with an `acp` provider, the pinned
//! `tests/opencode` against the tests' scripted chat-completions server): the same time to the
//! first model request, a turn through runnerd (runtime, files, sandbox, `opencode acp`,
//! `initialize`, `session/new` with the bridge, `session/prompt`, the gateway) against the bare
//! `opencode acp` started by hand with the same generated config and driven over its stdio by
//! the same ACP client code, pointing straight at the model and offered no bridge. Its bridge
//! calls are the bridge rows above: the binary and runnerd's endpoint are the same whichever
//! CLI starts the bridge.
//!
//! Run: `cargo bench --bench runnerd_turn` (optionally `-- N` starts per series; default 15,
//! after 2 warm-up starts each). A benchmark: nothing is asserted about timings; it exits
//! non-zero only when a start fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
#[path = "common/runnerd.rs"]
mod runnerd;
#[path = "../crates/runner/tests/support/mod.rs"]
mod support;

use agentworks_runner::claude::ClaudeDriver;
use agentworks_runner::driver::{CliDriver, TurnSetup};
use runnerd::{BenchRunnerd, HeldTurn, WITHIN, holder_cli};
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::chat_completions::{self, ScriptedChat};
use support::messages::{self, ScriptedMessages};
use support::responses::{Reply, ScriptedResponses};
use support::{RecordedRequest, claude_binary, codex_binary, opencode_binary};

const WARMUP: usize = 2;

fn main() {
    let starts: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(15);
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-runnerd");
    std::fs::create_dir_all(&base).unwrap();
    codex_rows(&base, starts);
    claude_rows(&base, starts);
    opencode_rows(&base, starts);
}

/// Codex's rows: the time to its first model request through runnerd against the bare
/// `codex exec`, and a bridge call against the model loop's direct call of the same tool.
fn codex_rows(base: &Path, starts: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let total = 2 * (WARMUP + starts);
    let model = runtime
        .block_on(ScriptedResponses::start(
            (0..total)
                .map(|i| Reply::Text(format!("answer {i}")))
                .collect(),
        ))
        .unwrap();
    let codex = codex_binary();
    let holder = holder_cli(base);
    let runnerd = BenchRunnerd::start(
        base,
        &format!(
            "[runnerd.providers.codex]\ndriver = \"codex\"\n\
             executable = \"{}\"\nmodel = \"scripted\"\nupstream = \"{}\"\n\
             [runnerd.providers.holder]\ndriver = \"codex\"\nexecutable = \"{}\"\n\
             model = \"none\"\nupstream = \"{}\"\n",
            codex.display(),
            model.base_url(),
            holder.display(),
            model.base_url()
        ),
    );
    let (state, socket) = (&runnerd.state, runnerd.socket());

    let bare_home = tempfile::Builder::new()
        .prefix("bare-")
        .tempdir_in(base)
        .unwrap();
    let config = agentworks_runner::codex::config_toml(&agentworks_runner::codex::CodexConfig {
        model: "scripted",
        gateway_base_url: &model.base_url(),
        key_env: "AGENTWORKS_MODEL_KEY",
        bridge: None,
        builder: false,
        bound: false,
    })
    .unwrap();
    std::fs::create_dir_all(bare_home.path().join("codex")).unwrap();
    std::fs::write(bare_home.path().join("codex/config.toml"), config).unwrap();

    let mut through_runnerd = Vec::new();
    let mut bare = Vec::new();
    for i in 0..(WARMUP + starts) {
        let seen = model.requests().len();
        let t = runnerd_turn(&socket, &turn_request("codex", &format!("bench-{i}")));
        through_runnerd.push(first_request_after(&model.requests(), seen, t));
        let seen = model.requests().len();
        let t = bare_codex(&codex, bare_home.path());
        bare.push(first_request_after(&model.requests(), seen, t));
    }
    println!("Codex: time from the turn's start to the CLI's first model request:");
    let ours = report("through runnerd (sandboxed)", &through_runnerd);
    let theirs = report("bare codex exec", &bare);
    let more = ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0;
    println!(
        "{:>34}: {more:+.1} ms at p50 ({:.2}x; goal: at most +150 ms)",
        "runnerd adds",
        ours.as_secs_f64() / theirs.as_secs_f64()
    );

    let calls = 10 * starts.max(3);
    let (bridge, direct) = bridge_against_direct(state.path(), &socket, calls);
    println!("Codex: a tool call (execute_shell_command of `true`, a fresh sandbox each):");
    let ours = report("through the bridge", &bridge);
    let theirs = report("direct (the model loop's executor)", &direct);
    println!(
        "{:>34}: {:+.1} ms at p50 (goal: at most +5 ms)",
        "the bridge adds",
        ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0
    );
}

/// `calls` round trips of `execute_shell_command {command: "true"}` through the bridge of a
/// held turn, alternating with the same command run directly in the same sandbox (runnerd's
/// binary is the launcher); the warm-up calls first.
fn bridge_against_direct(
    state: &Path,
    socket: &Path,
    calls: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let request = json!({
        "chat_id": "bench-bridge",
        "user_id": "bench",
        "project": "p",
        "provider": "holder",
        "mode": "run",
        "guard": {},
        "prompt": "hold",
    });
    let mut curl = Command::new("curl")
        .args(["-sS", "-N", "--unix-socket"])
        .arg(socket)
        .args([
            "-X",
            "POST",
            "--data-binary",
            "@-",
            "http://runnerd/v1/turns",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn curl");
    curl.stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let held = HeldTurn::wait(state);
    let mut bridge = Command::new(env!("CARGO_BIN_EXE_agentworks-mcpbridge"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(agentworks_runner::bridge::URL_ENV, &held.url)
        .env(agentworks_runner::bridge::TOKEN_ENV, &held.token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the bridge");
    let mut to_bridge = bridge.stdin.take().unwrap();
    let mut from_bridge = std::io::BufReader::new(bridge.stdout.take().unwrap()).lines();
    let mut rpc = |message: serde_json::Value, answered: bool| {
        writeln!(to_bridge, "{message}").unwrap();
        if answered {
            let line = from_bridge.next().unwrap().unwrap();
            assert!(!line.contains("\"isError\":true"), "{line}");
        }
    };
    rpc(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}),
        true,
    );
    rpc(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        false,
    );

    let project = state.join("documents/p");
    let pin =
        agentworks_sandbox::PinnedDir::open(&std::fs::canonicalize(&project).unwrap()).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let launcher =
        agentworks_sandbox::process::Launcher::at(env!("CARGO_BIN_EXE_agentworks-runnerd"));
    let runtime_rt = tokio::runtime::Runtime::new().unwrap();
    let direct_call = || {
        let policy = agentworks_sandbox::SandboxPolicy {
            pinned: vec![pin.grant(agentworks_sandbox::PinnedAccess::ReadOnly)],
            read_write: Vec::new(),
            read_only: Vec::new(),
            read_only_if_present: Vec::new(),
            blocked: Vec::new(),
            read_only_within: Vec::new(),
            denied: Vec::new(),
            scratch: scratch.path().to_owned(),
            cwd: pin.path().to_owned(),
            limits: Default::default(),
            overmount_exclusions: false,
            private_terminals: false,
        };
        let command = agentworks_sandbox::shell::ShellCommand {
            command: "true".into(),
            timeout: None,
            policy,
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        };
        let outcome = runtime_rt
            .block_on(agentworks_sandbox::shell::run(
                &launcher,
                command,
                tokio_util::sync::CancellationToken::new(),
            ))
            .unwrap();
        assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    };
    let (mut through_bridge, mut direct) = (Vec::new(), Vec::new());
    for i in 0..(WARMUP + calls) {
        let started = Instant::now();
        rpc(
            json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {
                "name": "execute_shell_command", "arguments": {"command": "true"}}}),
            true,
        );
        through_bridge.push(started.elapsed());
        let started = Instant::now();
        direct_call();
        direct.push(started.elapsed());
    }
    drop(to_bridge);
    let _ = bridge.wait();
    held.stop();
    let _ = curl.wait();
    (through_bridge, direct)
}

/// A Run turn of `provider` in chat `chat` on project `p`.
fn turn_request(provider: &str, chat: &str) -> serde_json::Value {
    json!({
        "chat_id": chat,
        "user_id": "bench",
        "project": "p",
        "provider": provider,
        "mode": "run",
        "guard": {},
        "prompt": "say hi",
    })
}

/// Starts a turn on runnerd.sock (as agentd would, through curl) and reads it to its end;
/// returns when it started.
fn runnerd_turn(socket: &Path, request: &serde_json::Value) -> Instant {
    let started = Instant::now();
    let mut curl = Command::new("curl")
        .args(["-sS", "-N", "--unix-socket"])
        .arg(socket)
        .args([
            "-X",
            "POST",
            "--data-binary",
            "@-",
            "http://runnerd/v1/turns",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn curl");
    curl.stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let stdout = curl.stdout.take().unwrap();
    let mut last = String::new();
    for line in std::io::BufReader::new(stdout).lines() {
        last = line.unwrap();
    }
    curl.wait().unwrap();
    assert!(last.contains("\"end\""), "the turn failed: {last}");
    started
}

/// Runs `codex exec --json` by hand with `home`'s config pointing at the model; returns when
/// it was started.
fn bare_codex(codex: &Path, home: &Path) -> Instant {
    let started = Instant::now();
    let mut child = Command::new(codex)
        .args(agentworks_runner::codex::args(None))
        .current_dir(home)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("CODEX_HOME", home.join("codex"))
        .env("AGENTWORKS_MODEL_KEY", "bench")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn codex");
    child.stdin.take().unwrap().write_all(b"say hi").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "codex exec failed");
    started
}

/// The time from `started` to the first of `requests` after the first `seen`.
fn first_request_after(requests: &[RecordedRequest], seen: usize, started: Instant) -> Duration {
    let first = requests.get(seen).expect("the CLI asked the model");
    first.at.duration_since(started)
}

/// Prints a series' p50, min and max (its warm-up samples left out); returns its p50.
fn report(name: &str, samples: &[Duration]) -> Duration {
    let mut sorted = samples[WARMUP..].to_vec();
    sorted.sort();
    let p50 = sorted[sorted.len() / 2];
    println!(
        "{name:>34}: p50 {:7.1} ms  min {:7.1} ms  max {:7.1} ms  (n = {})",
        p50.as_secs_f64() * 1000.0,
        sorted[0].as_secs_f64() * 1000.0,
        sorted[sorted.len() - 1].as_secs_f64() * 1000.0,
        sorted.len()
    );
    p50
}

/// Claude Code's rows: the time to its first model request through runnerd against the bare
/// `claude` with the driver's files, arguments and environment; and a tool call as Claude Code
/// makes it, the bridge's shell against its own `Bash`, both through runnerd.
fn claude_rows(base: &Path, starts: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let runs = WARMUP + starts;
    // The whole script in the order the requests come: one text answer a start (runnerd's and
    // the bare one's alternating), then a call and a text answer a turn (the bridge's shell and
    // Bash alternating).
    let mut script: Vec<messages::Reply> = (0..2 * runs)
        .map(|i| messages::Reply::Text(format!("answer {i}")))
        .collect();
    for i in 0..runs {
        script.push(messages::Reply::mcp(
            "bridge",
            "execute_shell_command",
            &format!("toolu_bridge_{i}"),
            json!({"command": "true"}),
        ));
        script.push(messages::Reply::Text("bridged".into()));
        script.push(messages::Reply::bash(&format!("toolu_bash_{i}"), "true"));
        script.push(messages::Reply::Text("ran".into()));
    }
    let model = runtime.block_on(ScriptedMessages::start(script)).unwrap();
    let claude = claude_binary();
    let runnerd = BenchRunnerd::start(
        base,
        &format!(
            "[runnerd.providers.claude]\ndriver = \"claude\"\nexecutable = \"{}\"\n\
             model = \"scripted-claude\"\nupstream = \"{}\"\n",
            claude.display(),
            model.base_url()
        ),
    );
    let socket = runnerd.socket();

    // The bare run's runtime, made by hand: the files the driver writes (the instructions, the
    // bridge in mcp.json, the commands' env file), with the model itself as its base URL.
    let bare_dir = tempfile::Builder::new()
        .prefix("bare-claude-")
        .tempdir_in(base)
        .unwrap();
    let guidance = agentworks_runner::runtime::guidance(
        agentworks_contract::runnerd::Mode::Run,
        &runnerd.state.path().join("documents/p"),
        &[],
        &[],
        &[],
    );
    let base_url = model.base_url();
    let setup = TurnSetup {
        model: "scripted-claude",
        gateway_base_url: &base_url,
        bridge_command: Some(env!("CARGO_BIN_EXE_agentworks-mcpbridge")),
        builder: false,
        bound: false,
        runtime_dir: bare_dir.path(),
        guidance: &guidance,
        acp: None,
    };
    for file in ClaudeDriver.files(&setup).unwrap() {
        let path = bare_dir.path().join(&file.path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, file.content).unwrap();
    }
    for dir in ["home", "tmp"] {
        std::fs::create_dir_all(bare_dir.path().join(dir)).unwrap();
    }

    let (mut through_runnerd, mut bare) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let seen = model.requests().len();
        let t = runnerd_turn(
            &socket,
            &turn_request("claude", &format!("bench-claude-{i}")),
        );
        through_runnerd.push(first_request_after(&model.requests(), seen, t));
        let seen = model.requests().len();
        let t = bare_claude(&claude, &setup);
        bare.push(first_request_after(&model.requests(), seen, t));
    }
    println!("Claude Code: time from the turn's start to the CLI's first model request:");
    let ours = report("through runnerd (sandboxed)", &through_runnerd);
    let theirs = report("bare claude -p", &bare);
    println!(
        "{:>34}: {:+.1} ms at p50 ({:.2}x; goal: at most +150 ms)",
        "runnerd adds",
        ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0,
        ours.as_secs_f64() / theirs.as_secs_f64()
    );

    let (mut bridge, mut bash) = (Vec::new(), Vec::new());
    for i in 0..runs {
        for (kind, series) in [("bridge", &mut bridge), ("bash", &mut bash)] {
            let seen = model.requests().len();
            runnerd_turn(
                &socket,
                &turn_request("claude", &format!("bench-claude-{kind}-{i}")),
            );
            series.push(tool_round_trip(
                &model.requests()[seen..],
                &format!("toolu_{kind}_{i}"),
            ));
        }
    }
    println!(
        "Claude Code: a tool call (`true`), from the model's tool_use to the request with its result:"
    );
    let ours = report("bridge's execute_shell_command", &bridge);
    let theirs = report("Claude Code's own Bash", &bash);
    println!(
        "{:>34}: {:+.1} ms at p50",
        "the bridge adds",
        ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0
    );
}

/// Runs the bare `claude` by hand as the driver would have runnerd run it for `setup` (its
/// arguments and environment from [`ClaudeDriver::launch`], the bridge's variables set so it
/// starts, the prompt on stdin); returns when it was started.
fn bare_claude(claude: &Path, setup: &TurnSetup) -> Instant {
    let launch = ClaudeDriver.launch(setup, "bench", None).unwrap();
    let started = Instant::now();
    let mut child = Command::new(claude)
        .args(&launch.args)
        .current_dir(setup.runtime_dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", setup.runtime_dir.join("home"))
        .env("TMPDIR", setup.runtime_dir.join("tmp"))
        .envs(launch.env)
        .env(agentworks_runner::bridge::URL_ENV, "http://127.0.0.1:9")
        .env(agentworks_runner::bridge::TOKEN_ENV, "bench")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn claude");
    child.stdin.take().unwrap().write_all(b"say hi").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "claude -p failed");
    started
}

/// From the request answered with the call `id` (the first of `requests`) to the next one, which
/// must carry the call's result, not an error.
fn tool_round_trip(requests: &[RecordedRequest], id: &str) -> Duration {
    assert!(requests.len() >= 2, "no request after the call {id}");
    let result = requests[1]
        .messages()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
        .unwrap_or_else(|| panic!("no result of {id} in the next request"));
    assert_ne!(result["is_error"], true, "{id} failed: {result}");
    requests[1].at.duration_since(requests[0].at)
}

/// OpenCode's rows: the time to its first model request through runnerd (the ACP driver)
/// against the bare `opencode acp` driven by the same ACP client with the same generated config.
fn opencode_rows(base: &Path, starts: usize) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let total = 2 * (WARMUP + starts);
    let chat = runtime
        .block_on(ScriptedChat::start(
            (0..total)
                .map(|i| chat_completions::Reply::Text(format!("answer {i}")))
                .collect(),
        ))
        .unwrap();
    let opencode = opencode_binary();
    let runnerd = BenchRunnerd::start(
        base,
        &format!(
            "[runnerd.providers.opencode]\ndriver = \"acp\"\nexecutable = \"{}\"\n\
             model = \"scripted\"\nupstream = \"{}\"\n\
             [runnerd.providers.opencode.acp]\nagent = \"opencode\"\nargs = [\"acp\"]\n",
            opencode.display(),
            chat.base_url()
        ),
    );
    let socket = runnerd.socket();
    let bare_dir = tempfile::Builder::new()
        .prefix("bare-opencode-")
        .tempdir_in(base)
        .unwrap();
    let bare_opencode = BareOpenCode::new(bare_dir.path(), &chat.base_url());
    let mut through_runnerd = Vec::new();
    let mut bare = Vec::new();
    for i in 0..(WARMUP + starts) {
        let seen = chat.requests().len();
        let t = runnerd_turn(&socket, &turn_request("opencode", &format!("bench-{i}")));
        through_runnerd.push(first_request_after(&chat.requests(), seen, t));
        let seen = chat.requests().len();
        let t = bare_opencode.run(&runtime, &opencode);
        bare.push(first_request_after(&chat.requests(), seen, t));
    }
    println!("OpenCode: time from the turn's start to its first model request:");
    let ours = report("OpenCode through runnerd (ACP)", &through_runnerd);
    let theirs = report("bare opencode acp", &bare);
    println!(
        "{:>34}: {:+.1} ms at p50 ({:.2}x; goal: at most +150 ms)",
        "runnerd adds",
        ours.as_secs_f64() * 1000.0 - theirs.as_secs_f64() * 1000.0,
        ours.as_secs_f64() / theirs.as_secs_f64()
    );
}

/// `opencode acp` by hand: the ACP driver's files for a turn pointing straight at the model
/// (no bridge), in a runtime of its own, and its launch environment.
struct BareOpenCode {
    dir: std::path::PathBuf,
    options: agentworks_runner::acp::AcpOptions,
    base_url: String,
}

impl BareOpenCode {
    fn new(dir: &Path, base_url: &str) -> BareOpenCode {
        for sub in [
            "home/.config",
            "home/.cache",
            "home/.local/share",
            "home/.local/state",
            "tmp",
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let bare = BareOpenCode {
            dir: dir.to_owned(),
            options: agentworks_runner::acp::AcpOptions {
                args: vec!["acp".into()],
                agent: agentworks_runner::acp::AcpAgent::OpenCode,
                api: agentworks_runner::acp::AcpApi::ChatCompletions,
            },
            base_url: base_url.to_owned(),
        };
        use agentworks_runner::driver::CliDriver;
        for file in agentworks_runner::acp::AcpDriver
            .files(&bare.setup())
            .unwrap()
        {
            let path = dir.join(&file.path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, file.content).unwrap();
        }
        bare
    }

    fn setup(&self) -> agentworks_runner::driver::TurnSetup<'_> {
        agentworks_runner::driver::TurnSetup {
            model: "scripted",
            gateway_base_url: &self.base_url,
            bridge_command: None,
            builder: false,
            bound: false,
            runtime_dir: &self.dir,
            guidance: "Say hi.",
            acp: Some(&self.options),
        }
    }

    /// One turn: `opencode acp` started, `initialize`, `session/new`, `session/prompt` to its
    /// answer, its input closed and its exit awaited; returns when it was started.
    fn run(&self, runtime: &tokio::runtime::Runtime, opencode: &Path) -> Instant {
        use agentworks_runner::driver::{CliDriver, Conversation};
        let setup = self.setup();
        let driver = agentworks_runner::acp::AcpDriver;
        let launch = driver.launch(&setup, "bench", None).unwrap();
        let Conversation::Acp(session) = driver.conversation(&setup, None) else {
            panic!("the ACP driver's conversation is ACP")
        };
        let home = self.dir.join("home");
        runtime.block_on(async {
            let started = Instant::now();
            let mut child = tokio::process::Command::new(opencode)
                .args(&launch.args)
                .current_dir(&self.dir)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("LANG", "C.UTF-8")
                .env("HOME", &home)
                .env("TMPDIR", self.dir.join("tmp"))
                .env("XDG_CONFIG_HOME", home.join(".config"))
                .env("XDG_CACHE_HOME", home.join(".cache"))
                .env("XDG_DATA_HOME", home.join(".local/share"))
                .env("XDG_STATE_HOME", home.join(".local/state"))
                .envs(launch.env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn opencode");
            let stdin = child.stdin.take().unwrap();
            let stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
            let cancel = tokio_util::sync::CancellationToken::new();
            let outcome = tokio::time::timeout(
                WITHIN,
                agentworks_runner::acp::converse(
                    stdout,
                    stdin,
                    &session,
                    "say hi",
                    &cancel,
                    &mut |_| {},
                ),
            )
            .await
            .expect("the bare opencode turn ran too long");
            outcome.expect("the bare opencode turn failed");
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
            started
        })
    }
}
