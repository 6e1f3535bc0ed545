//! The web console in a real browser: Debian's chromium, driven by Playwright
//! (tests/console/run.mjs), against the real agentd, workspaced and gatewayd, a real
//! `agentworks executor connect` on a real folder, and the scripted model. One browser and one
//! stack for all scenarios; what only this side can do (script the model, read its request log,
//! stop the executor) the script asks for on its stdout (`NEED …`) and we answer on its stdin.
//! The real runnerd (with the real Codex against a scripted Responses server, and the real
//! Claude Code against a scripted Messages server) starts only when the `cli-chat` scenario
//! asks, so the scenarios before it see a stack without runnerd; `cli-laptop` binds a Claude
//! Code chat to the laptop folder (the executor started again) and runs a command there.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use super::agent::{LaptopExt, Setup, calls, text};
use super::agent_cli::runnerd_config;
use super::attachments::PNG;
use super::console_sessions::{PASSWORD, origin, passwd};
use super::harness::{Runnerd, http};
use super::runner_support::claude_binary;
use super::runner_support::messages::{self, ScriptedMessages};
use super::runner_support::responses::{Reply, ScriptedResponses};

const CHROMIUM: &str = "/usr/bin/chromium";
const TEXT_FILE: &str = "# Plan\nship the console\n";
/// The command the `cli-chat` scenario stops; not agent_cli's `sleep 120`, which may run at the
/// same time in the suite, so the check below sees only this one.
const CLI_SLEEP: &[&str] = &["sleep", "123"];
const SCENARIOS: &[&str] = &[
    "sign-in",
    "new-chat",
    "streamed-tool",
    "attachments",
    "script-as-text",
    "stop",
    "local-cli",
    "executor-offline",
    "chat-title",
    "cli-chat",
    "cli-laptop",
    "device-approve",
    "cross-origin",
    "connections",
    "reused-sign-in-link",
    "sign-out-replay",
];

pub(super) fn console_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

/// Fails (never skips) when the browser or Playwright is missing, naming the fix.
pub(super) fn require_browser() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install it with `apt-get install -y chromium`"
    );
    assert!(
        console_dir().join("node_modules/playwright-core").is_dir(),
        "tests/console/node_modules/playwright-core is missing: run `npm ci --ignore-scripts` in tests/console"
    );
}

/// A screenshot that is a PNG with more than one colour (a blank page has one).
pub(super) fn assert_not_blank(path: &Path) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap_or_else(|e| panic!("{} is not a PNG: {e}", path.display()));
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    let step = info.color_type.samples() * usize::from(info.bit_depth as u8).div_ceil(8);
    let pixels = &pixels[..info.buffer_size()];
    let first = &pixels[..step];
    assert!(
        pixels.chunks(step).any(|p| p != first),
        "{} is blank ({}x{}, one colour)",
        path.display(),
        info.width,
        info.height
    );
}

/// The file the `cli-laptop` scenario's command makes in the laptop folder, and what it holds.
const LAPTOP_FILE: (&str, &str) = ("claude-made.txt", "from-claude\n");

/// The `cli-chat` and `cli-laptop` scenarios' side: the scripted Responses server Codex asks
/// (its whole script, three turns), the scripted Messages server Claude Code asks (one turn),
/// and runnerd once started.
struct Cli {
    model: ScriptedResponses,
    claude: ScriptedMessages,
    runnerd: Option<Runnerd>,
    keys: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

impl Cli {
    fn start() -> Cli {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let model = runtime
            .block_on(ScriptedResponses::start(vec![
                // Turn 1: read through project/, patch through the bridge, answer.
                Reply::exec_command("c1", "cat project/server.txt"),
                Reply::McpCall {
                    server: "bridge".into(),
                    tool: "diff_patch_workspace_file".into(),
                    call_id: "c2".into(),
                    arguments: json!({"filepath": "plan.txt", "diff": "@@ -1 +1 @@\n-draft\n+shipped\n"}),
                },
                Reply::Text("server.txt says server file; plan.txt now says shipped.".into()),
                // Turn 2: the same thread.
                Reply::Text("Still the same thread.".into()),
                // Turn 3: a command the page stops.
                Reply::exec_command("c3", &CLI_SLEEP.join(" ")),
            ]))
            .unwrap();
        let claude = runtime
            .block_on(ScriptedMessages::start(vec![
                // Bound to the laptop: a command through the bridge, which runs there.
                messages::Reply::mcp(
                    "bridge",
                    "execute_shell_command",
                    "toolu_l1",
                    json!({"command": format!("echo {} > {}", LAPTOP_FILE.1.trim_end(), LAPTOP_FILE.0)}),
                ),
                messages::Reply::Text("Claude made the file on your laptop.".into()),
            ]))
            .unwrap();
        Cli {
            model,
            claude,
            runnerd: None,
            keys: tempfile::tempdir().unwrap(),
            _runtime: runtime,
        }
    }

    /// The `[runnerd.providers.claude]` table: the real Claude Code against [`Cli::claude`],
    /// with the key file [`runnerd_config`] wrote.
    fn claude_provider(&self) -> String {
        format!(
            "\n[runnerd.providers.claude]\ndriver = \"claude\"\nexecutable = \"{}\"\nmodel = \"scripted-claude\"\nupstream = \"{}\"\nkey_file = \"{}\"\n",
            claude_binary().display(),
            self.claude.base_url(),
            self.keys.path().join("provider.key").display()
        )
    }
}

/// The pids of running `sleep 123` processes (their command line, from /proc).
fn cli_sleeps() -> Vec<u32> {
    let wanted: Vec<u8> = CLI_SLEEP
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `done` every 100 ms until it holds or `within` passes.
fn wait_for(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// Answers one `NEED` of run.mjs: `Ok` or why not.
fn serve(setup: &mut Setup, cli: &mut Cli, need: &str) -> Result<(), String> {
    let model = &setup.model;
    match need {
        "streamed-tool" => model.play(vec![
            calls(&[("r1", "read_file", json!({"path": "server.txt"}))]),
            text("The file says: server file"),
        ]),
        "attachments" => {
            model.clear();
            model.play(vec![
                calls(&[("i1", "read_image", json!({"name": "shot.png"}))]),
                text("a one-pixel image"),
            ]);
        }
        "check-attachments" => {
            let requests = model.requests();
            let first = requests.first().ok_or("the model got no request")?;
            // This turn's message: the last user message (earlier turns come first).
            let message = first["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            if !message.contains(TEXT_FILE.trim_end()) {
                return Err(format!("no text preview in the model's message: {message}"));
            }
            if !message.contains("[attached image \"shot.png\"") {
                return Err(format!("the image is not named to the model: {message}"));
            }
            use base64::Engine as _;
            let expected = format!(
                "data:image/png;base64,{}",
                base64::engine::general_purpose::STANDARD.encode(PNG)
            );
            let second = requests
                .get(1)
                .ok_or("no request after read_image")?
                .to_string();
            if !second.contains(&expected) {
                return Err("the model never received the image's bytes".into());
            }
        }
        "script-as-text" => model.play(vec![text("<script>alert(1)</script> is only text")]),
        "stop" => {
            model.play(vec![]);
            model.play_slowly(Duration::from_secs(30), text("never shown"));
        }
        "local-cli" => {
            // The command is held back 3 s so the page can see the turn running.
            model.play(vec![]);
            model.play_slowly(
                Duration::from_secs(3),
                calls(&[(
                    "c1",
                    "execute_shell_command",
                    json!({"command": "echo from-the-browser > made.txt"}),
                )]),
            );
            model.play_slowly(Duration::ZERO, text("made it"));
        }
        "check-laptop-file" => {
            let made = setup.laptop.repo().join("made.txt");
            match std::fs::read_to_string(&made) {
                Ok(s) if s == "from-the-browser\n" => {}
                other => return Err(format!("{}: {other:?}", made.display())),
            }
        }
        "stop-executor" => {
            let executor = setup.executor.as_mut().ok_or("no executor")?;
            kill(Pid::from_raw(executor.child.id() as i32), Signal::SIGTERM)
                .map_err(|e| e.to_string())?;
            executor.child.wait().map_err(|e| e.to_string())?;
        }
        "start-runnerd" => {
            setup.stack.state.project("app", &[("plan.txt", "draft\n")]);
            cli.runnerd = Some(Runnerd::start(&setup.stack.state));
        }
        "check-cli-patch" => {
            let plan = setup.stack.state.documents().join("app/plan.txt");
            match std::fs::read_to_string(&plan) {
                Ok(s) if s == "shipped\n" => {}
                other => return Err(format!("{}: {other:?}", plan.display())),
            }
        }
        "check-cli-resume" => {
            // The second turn's request carries the first turn's conversation: Codex resumed
            // its thread.
            let requests = cli.model.requests();
            let last = requests.last().ok_or("Codex never asked the model")?;
            let input = serde_json::to_string(last.input()).map_err(|e| e.to_string())?;
            for said in [
                "Read server.txt and fix plan.txt.",
                "server file",
                "And now?",
            ] {
                if !input.contains(said) {
                    return Err(format!("the second turn's request lacks {said:?}: {input}"));
                }
            }
        }
        "start-executor" => {
            // `executor-offline` stopped it: the same laptop, logged in already, connects again
            // (an executor still running would be killed as it is dropped).
            setup.executor = Some(setup.laptop.connect());
            setup.wait_device(true);
        }
        "check-cli-laptop" => {
            let made = setup.laptop.repo().join(LAPTOP_FILE.0);
            match std::fs::read_to_string(&made) {
                Ok(s) if s == LAPTOP_FILE.1 => {}
                other => return Err(format!("{}: {other:?}", made.display())),
            }
            let on_server = setup
                .stack
                .state
                .documents()
                .join("app")
                .join(LAPTOP_FILE.0);
            if on_server.exists() {
                return Err(format!("{} exists on the server", on_server.display()));
            }
            // Bound, Claude Code offered the model the bridge's tools and none of its own.
            let requests = cli.claude.requests();
            if requests.len() != 2 {
                return Err(format!(
                    "Claude Code asked the model {} times: {requests:#?}",
                    requests.len()
                ));
            }
            let offered = requests[0].tool_names();
            if !offered
                .iter()
                .any(|t| t == "mcp__bridge__execute_shell_command")
                || offered.iter().any(|t| !t.starts_with("mcp__bridge__"))
            {
                return Err(format!("the bound Claude Code offered {offered:?}"));
            }
        }
        "wait-cli-sleep" => {
            if !wait_for(Duration::from_secs(60), || !cli_sleeps().is_empty()) {
                return Err(format!("`{}` never ran", CLI_SLEEP.join(" ")));
            }
        }
        "check-cli-sleep-gone" => {
            if !wait_for(Duration::from_secs(5), || cli_sleeps().is_empty()) {
                return Err(format!(
                    "`{}` still runs 5 s after Stop: pids {:?}",
                    CLI_SLEEP.join(" "),
                    cli_sleeps()
                ));
            }
        }
        other => return Err(format!("unknown need {other}")),
    }
    Ok(())
}

#[test]
fn the_console_works_in_a_real_browser() {
    require_browser();
    let started = Instant::now();
    // agentd offers the build folder's laptop CLI, as a quickstart's does: the setup step shows
    // its install line.
    let build_folder = Path::new(env!("CARGO_BIN_EXE_agentworks"))
        .parent()
        .unwrap();
    let mut cli = Cli::start();
    let runnerd = format!(
        "{}{}",
        runnerd_config(cli.keys.path(), &cli.model.base_url()),
        cli.claude_provider()
    );
    let mut setup = Setup::start_with(true, &format!("cli_dir = {build_folder:?}\n\n{runnerd}"));
    let set = passwd(&setup.stack, "alice", PASSWORD);
    assert!(set.status.success(), "{set:?}");

    let files = tempfile::tempdir().unwrap();
    let image = files.path().join("shot.png");
    std::fs::write(&image, PNG).unwrap();
    let notes = files.path().join("notes.md");
    std::fs::write(&notes, TEXT_FILE).unwrap();
    let shots = std::env::var_os("AGENTWORKS_CONSOLE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| files.path().join("screenshots"));
    std::fs::create_dir_all(&shots).unwrap();

    // The approval page may not be on this branch yet: run its scenario only when it is.
    let (status, headers, _) = http(setup.stack.port, "GET", "/v1/device/approve", &[], "");
    let has_approval_page = status == 200
        && headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/html"));
    let scenarios: Vec<&str> = SCENARIOS
        .iter()
        .copied()
        .filter(|s| *s != "device-approve" || has_approval_page)
        .collect();
    if !has_approval_page {
        println!("NOT RUN device-approve: the approval page is not on this branch");
    }
    // A sign-in link as an operator makes one, with the real agentworksctl.
    let made = setup.stack.ctl(&["user", "sign-in-link", "alice"]);
    let printed = String::from_utf8_lossy(&made.stdout);
    assert!(made.status.success(), "{made:?}");
    let sign_in_link = printed.lines().next().unwrap_or_default().to_owned();
    assert!(
        sign_in_link.starts_with(&format!("{}/console/sign-in#code=", origin(&setup.stack))),
        "{printed}"
    );
    assert!(printed.contains("works once"), "{printed}");
    let config = files.path().join("config.json");
    let body = json!({
        "url": origin(&setup.stack),
        "username": "alice",
        "password": PASSWORD,
        "wrong_password": "not the password",
        "image": image,
        "text_file": notes,
        "sign_in_link": sign_in_link,
        "scenarios": scenarios,
    });
    std::fs::write(&config, body.to_string()).unwrap();

    let mut node = Command::new("node")
        .arg("run.mjs")
        .current_dir(console_dir())
        .env("AGENTWORKS_CONSOLE_CONFIG", &config)
        .env("AGENTWORKS_CONSOLE_SCREENSHOTS", &shots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("node runs (apt-get install -y nodejs)");
    let mut stdin = node.stdin.take().unwrap();
    let mut results = Vec::new();
    for line in BufReader::new(node.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(need) = line.strip_prefix("NEED ") {
            let answer = match serve(&mut setup, &mut cli, need) {
                Ok(()) => "ok".to_owned(),
                Err(why) => format!("fail {why}"),
            };
            writeln!(stdin, "{answer}").unwrap();
        } else if let Ok(result) = serde_json::from_str::<Value>(&line) {
            println!("{line}");
            results.push(result);
        } else {
            println!("run.mjs: {line}");
        }
    }
    let status = node.wait().unwrap();
    for result in &results {
        assert_eq!(result["ok"], true, "scenario failed: {result}");
        assert_not_blank(Path::new(result["screenshot"].as_str().unwrap()));
    }
    let ran: Vec<&str> = results
        .iter()
        .filter_map(|r| r["scenario"].as_str())
        .collect();
    assert_eq!(ran, scenarios, "not every scenario ran");
    assert!(status.success(), "run.mjs: {status}");
    println!(
        "console: {} scenarios in {:.1} s",
        ran.len(),
        started.elapsed().as_secs_f64()
    );
}

/// The blank check itself: a one-pixel PNG has one colour.
#[test]
#[should_panic(expected = "is blank")]
fn a_one_colour_screenshot_is_blank() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blank.png");
    std::fs::write(&path, PNG).unwrap();
    assert_not_blank(&path);
}
