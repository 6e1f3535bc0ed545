//! The Claude Code driver: Claude Code (`@anthropic-ai/claude-code`, tested at 2.1.337) run as
//! `claude --bare -p --output-format stream-json --verbose`, its configuration in
//! `CLAUDE_CONFIG_DIR`, talking the Anthropic Messages API to runnerd's model gateway.
//!
//! Owns: the files written to the turn's runtime (`CLAUDE.md`, the instructions,
//! `claude/mcp.json`, the bridge: [`mcp_config`], and `claude/command-env.sh`, which keeps the
//! capabilities out of the commands Claude Code runs), the command line after the executable
//! ([`args`]) and the environment ([`ClaudeDriver::launch`]), and the translation of the
//! stream-json stdout into the turn's events ([`EventParser`]). The shapes were read from the
//! real 2.1.337 binary (`crates/runner/tests/claude_cli.rs` runs it).
//!
//! Must never: put a key's value in a file or an argument (the turn's capability reaches Claude
//! Code as `ANTHROPIC_API_KEY` in its environment; the bridge's capability is named in
//! `mcp.json` as `${AGENTWORKS_BRIDGE_TOKEN}`, which Claude Code expands from its own
//! environment), turn on Claude Code's own permission prompts (ours is the boundary, see
//! [`args`]), offer a native tool in a chat bound to a laptop folder, or let a line Claude Code
//! prints make the parser fail: anything it does not understand is skipped.

use std::collections::HashMap;

use agentworks_contract::runnerd::TurnEvent;
use serde_json::{Value, json};

use crate::bridge;
use crate::driver::{
    BRIDGE_SERVER, CliDriver, Conversation, DriverError, Generated, Launch, StreamParser,
    TurnSetup, bounded, cli_failed, one_line, str_field,
};
use crate::gateway::KeyHeader;

/// The instructions file in the runtime, passed with `--append-system-prompt-file` (`--bare`
/// skips Claude Code's own CLAUDE.md discovery, so nothing else reads it).
pub const INSTRUCTIONS_FILE: &str = "CLAUDE.md";
/// Claude Code's configuration directory in the runtime (`CLAUDE_CONFIG_DIR`): its sessions,
/// its state file, and the generated `mcp.json`.
pub const CONFIG_DIR: &str = "claude";
/// The MCP configuration, relative to the runtime.
pub const MCP_CONFIG_FILE: &str = "claude/mcp.json";
/// The script Claude Code sources before each `Bash` command (`CLAUDE_ENV_FILE`), relative to
/// the runtime: it drops the turn's capabilities from the commands' environment.
pub const COMMAND_ENV_FILE: &str = "claude/command-env.sh";

/// What the commands Claude Code runs must not inherit from it: the model capability and the
/// bridge's URL and capability (as Codex's `shell_environment_policy.exclude` does). Claude
/// Code's own scrubbing (`CLAUDE_CODE_SUBPROCESS_ENV_SCRUB`) needs bubblewrap, which cannot
/// run inside our sandbox; `CLAUDE_ENV_FILE` is sourced by the command's own shell.
const KEPT_FROM_COMMANDS: [&str; 3] = ["ANTHROPIC_API_KEY", bridge::TOKEN_ENV, bridge::URL_ENV];

/// How many times Claude Code retries a failed model request. Its default (10, with a backoff
/// that reaches tens of seconds) keeps a turn whose operator key the upstream refuses (401, which
/// it retries too) waiting for minutes before it says so; two retries still ride out a short
/// overload.
const MAX_RETRIES: &str = "2";

/// The environment that keeps Claude Code's traffic to the model requests (seen with strace on
/// 2.1.337: without the first, it resolves names and connects to Anthropic's telemetry at
/// start and sends a `HEAD /api/hello` to the base URL), and its self-update off.
const QUIET_ENV: [(&str, &str); 5] = [
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("CLAUDE_CODE_MAX_RETRIES", MAX_RETRIES),
];

/// The Claude Code dialect as a [`CliDriver`].
pub struct ClaudeDriver;

impl CliDriver for ClaudeDriver {
    fn upstream_auth(&self) -> KeyHeader {
        KeyHeader::XApiKey
    }

    fn files(&self, setup: &TurnSetup) -> Result<Vec<Generated>, DriverError> {
        Ok(vec![
            Generated {
                path: INSTRUCTIONS_FILE.into(),
                content: setup.guidance.to_owned(),
            },
            Generated {
                path: MCP_CONFIG_FILE.into(),
                content: mcp_config(setup.bridge_command)?,
            },
            Generated {
                path: COMMAND_ENV_FILE.into(),
                content: format!("unset {}\n", KEPT_FROM_COMMANDS.join(" ")),
            },
        ])
    }

    fn launch(
        &self,
        setup: &TurnSetup,
        capability: &str,
        resume: Option<&str>,
    ) -> Result<Launch, DriverError> {
        if setup.model.trim().is_empty() {
            return Err(DriverError::Config(
                "the Claude Code provider has no model name".into(),
            ));
        }
        let base_url = anthropic_base_url(setup.gateway_base_url)?;
        let session = match resume {
            Some(id) if is_session_id(id) => Session::Resume(id),
            Some(id) => {
                return Err(DriverError::Config(format!(
                    "the session to resume, {:?}, is not a Claude Code session id (a UUID)",
                    id.chars().take(80).collect::<String>()
                )));
            }
            None => Session::New(new_session_id()),
        };
        let runtime = setup.runtime_dir;
        let mut env: Vec<(String, std::ffi::OsString)> = vec![
            ("CLAUDE_CONFIG_DIR".into(), runtime.join(CONFIG_DIR).into()),
            ("ANTHROPIC_BASE_URL".into(), base_url.into()),
            // The turn's capability, never the operator's key: the gateway swaps it.
            ("ANTHROPIC_API_KEY".into(), capability.into()),
            // Claude Code refuses bypassPermissions as root unless told it runs in a sandbox
            // ("cannot be used with root/sudo privileges"). It does: ours (crates/sandbox),
            // whoever runnerd runs as, and that is the boundary, not Claude Code's prompts.
            ("IS_SANDBOX".into(), "1".into()),
            (
                "CLAUDE_ENV_FILE".into(),
                runtime.join(COMMAND_ENV_FILE).into(),
            ),
        ];
        env.extend(QUIET_ENV.iter().map(|(n, v)| ((*n).into(), (*v).into())));
        Ok(Launch {
            args: args(
                setup.model,
                &runtime.join(INSTRUCTIONS_FILE).to_string_lossy(),
                &runtime.join(MCP_CONFIG_FILE).to_string_lossy(),
                setup.bound,
                &session,
            ),
            env,
        })
    }

    fn conversation(&self, _setup: &TurnSetup, _resume: Option<&str>) -> Conversation {
        Conversation::PromptOnStdin(Box::new(EventParser::new()))
    }
}

/// Which conversation a run continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Session<'a> {
    /// A new one under this id (`--session-id`).
    New(String),
    /// The chat's earlier one (`--resume`).
    Resume(&'a str),
}

/// The arguments after the executable. The prompt is not among them: Claude Code reads it from
/// stdin (an argument could be read by other local users in `/proc`).
///
/// - `--bare`: no hooks, plugins sync, auto-memory or CLAUDE.md discovery; the instructions
///   come from `instructions` alone, the MCP servers from `mcp_config` alone
///   (`--strict-mcp-config`), and `--setting-sources ""` ignores any settings file the CLI may
///   have left in its runtime on an earlier turn (seen: a project `settings.json`'s `env`
///   reached commands without it).
/// - `--permission-mode bypassPermissions`: Claude Code's own prompts are off; nobody is there
///   to answer one in `-p` mode, and the turn runs inside agentworks' sandbox (Landlock,
///   seccomp, a cgroup), which is the boundary.
/// - `bound`: `--tools ""`, no native tool at all (Bash, Edit, Read are then neither offered
///   to the model nor run when it names one: seen with 2.1.337); the bridge's MCP tools stay.
pub fn args(
    model: &str,
    instructions: &str,
    mcp_config: &str,
    bound: bool,
    session: &Session,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "--bare",
        "-p",
        "--output-format",
        "stream-json",
        // stream-json with -p requires it ("--output-format=stream-json requires --verbose").
        "--verbose",
        "--model",
        model,
        "--append-system-prompt-file",
        instructions,
        "--mcp-config",
        mcp_config,
        "--strict-mcp-config",
        "--setting-sources",
        "",
        "--permission-mode",
        "bypassPermissions",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    if bound {
        args.extend(["--tools".to_owned(), String::new()]);
    }
    match session {
        Session::New(id) => args.extend(["--session-id".to_owned(), id.clone()]),
        Session::Resume(id) => args.extend(["--resume".to_owned(), (*id).to_owned()]),
    }
    args
}

/// `mcp.json`: the bridge as the stdio server `bridge`, when runnerd has it (none otherwise).
/// Its URL and capability change every turn, so the file names them as `${VAR}`, which Claude
/// Code expands from its own environment when it starts the server: the file stays the same
/// from turn to turn (its hash is part of the session key) and holds no secret.
pub fn mcp_config(bridge_command: Option<&str>) -> Result<String, DriverError> {
    let mut servers = serde_json::Map::new();
    if let Some(command) = bridge_command {
        if command.is_empty() {
            return Err(DriverError::Config("the bridge's command is empty".into()));
        }
        let env: serde_json::Map<String, Value> = [bridge::URL_ENV, bridge::TOKEN_ENV]
            .into_iter()
            .map(|name| (name.to_owned(), Value::String(format!("${{{name}}}"))))
            .collect();
        servers.insert(
            BRIDGE_SERVER.to_owned(),
            json!({"type": "stdio", "command": command, "args": [], "env": env}),
        );
    }
    Ok(json!({ "mcpServers": servers }).to_string())
}

/// The gateway's base URL as `ANTHROPIC_BASE_URL`: without its `/v1`, which Claude Code adds
/// (`/v1/messages`).
fn anthropic_base_url(gateway_base_url: &str) -> Result<String, DriverError> {
    let url = gateway_base_url.trim_end_matches('/');
    match url.strip_suffix("/v1") {
        Some(base) if base.starts_with("http://") || base.starts_with("https://") => {
            Ok(base.to_owned())
        }
        _ => Err(DriverError::Config(format!(
            "the model gateway's base URL {gateway_base_url:?} is not an http(s) URL ending in /v1"
        ))),
    }
}

/// A random (version 4) UUID, the form `--session-id` takes.
fn new_session_id() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Whether `id` has a UUID's form (8-4-4-4-12 hex digits): Claude Code's session ids do, and
/// nothing else is passed to `--resume` or reported as the chat's session.
pub fn is_session_id(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Turns `claude -p --output-format stream-json --verbose` stdout lines into the turn's events.
///
/// Claude Code 2.1.337 prints one JSON object a line: `system` (`init` with the `session_id`,
/// `api_retry` with the failed request's status, others), `assistant` (a model message: its
/// `content` blocks, `text` and `tool_use`), `user` (the tools' `tool_result` blocks going back
/// to the model), and last `result` (`is_error`, the `result` text). Usage is not taken from it:
/// the gateway counts every request.
#[derive(Debug, Default)]
pub struct EventParser {
    /// The tools of the calls whose [`TurnEvent::ToolCall`] went out, by id: their result is
    /// reported once.
    calls: HashMap<String, CallKind>,
    /// The last failed model request (`api_retry`), for a run that ends without a result.
    last_error: Option<String>,
    /// `result` was seen.
    ended: bool,
}

/// What a call's result reports as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    /// The native `Bash`: 0, or the code its error names.
    Shell,
    /// Any other tool: none.
    Other,
    /// Its result was reported.
    Done,
}

/// The most calls one turn remembers (a stream that names more is hostile or broken; a call
/// past it still shows, its result without an exit code).
const MAX_CALLS: usize = 10_000;

impl EventParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// One stdout line: the events it makes (none for lines that are not Claude Code's events).
    pub fn line(&mut self, line: &str) -> Vec<TurnEvent> {
        let Ok(event) = serde_json::from_str::<Value>(line.trim()) else {
            tracing::debug!(line, "claude printed a line that is not JSON");
            return Vec::new();
        };
        match str_field(&event, "type") {
            "system" => self.system(&event),
            "assistant" => self.assistant(&event),
            "user" => self.tool_results(&event),
            "result" => self.result(&event),
            kind => {
                tracing::debug!(kind, "claude event skipped");
                Vec::new()
            }
        }
    }

    /// Claude Code's stdout ended (the process exited with `exit_code`): a failure when no
    /// `result` came, so a crash is never taken for an answer.
    pub fn finish(&mut self, exit_code: Option<i32>) -> Vec<TurnEvent> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        let status = match exit_code {
            Some(code) => format!("exited with status {code}"),
            None => "was killed".to_owned(),
        };
        let message = match &self.last_error {
            Some(error) => format!("Claude Code {status} before the turn ended: {error}"),
            None => format!("Claude Code {status} before the turn ended"),
        };
        vec![cli_failed(message)]
    }

    fn system(&mut self, event: &Value) -> Vec<TurnEvent> {
        match str_field(event, "subtype") {
            "init" => {
                let id = str_field(event, "session_id");
                if is_session_id(id) {
                    vec![TurnEvent::Session {
                        session_id: id.to_owned(),
                    }]
                } else {
                    tracing::debug!("claude's init has no session id of a UUID's form");
                    Vec::new()
                }
            }
            "api_retry" => {
                let status = event.get("error_status").and_then(Value::as_u64);
                let error = one_line(str_field(event, "error"));
                self.last_error = Some(bounded(&match status {
                    Some(status) => format!("the model API answered {status} ({error})"),
                    None => format!("the model request failed ({error})"),
                }));
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn assistant(&mut self, event: &Value) -> Vec<TurnEvent> {
        // Claude Code's own message for a failed request ("Invalid API key · …"): the
        // `result` that follows carries it as the turn's failure.
        if event.get("is_api_error_message").and_then(Value::as_bool) == Some(true) {
            return Vec::new();
        }
        let mut events = Vec::new();
        for block in content_blocks(event) {
            match str_field(block, "type") {
                "text" => {
                    let text = str_field(block, "text");
                    if !text.trim().is_empty() {
                        events.push(TurnEvent::Text {
                            text: bounded(text),
                        });
                    }
                }
                "tool_use" => {
                    let id = str_field(block, "id");
                    if id.is_empty() || self.calls.contains_key(id) {
                        continue;
                    }
                    let input = block.get("input").unwrap_or(&Value::Null);
                    let (tool, command, kind) = describe_call(str_field(block, "name"), input);
                    if self.calls.len() < MAX_CALLS {
                        self.calls.insert(id.to_owned(), kind);
                    }
                    events.push(TurnEvent::ToolCall {
                        call_id: id.to_owned(),
                        tool,
                        command: bounded(&one_line(&command)),
                    });
                }
                _ => {}
            }
        }
        events
    }

    fn tool_results(&mut self, event: &Value) -> Vec<TurnEvent> {
        let mut events = Vec::new();
        for block in content_blocks(event) {
            if str_field(block, "type") != "tool_result" {
                continue;
            }
            let id = str_field(block, "tool_use_id");
            // Only a call that was shown, once.
            let Some(kind) = self.calls.get_mut(id) else {
                continue;
            };
            if *kind == CallKind::Done {
                continue;
            }
            let output = result_text(block.get("content"));
            let is_error = block.get("is_error").and_then(Value::as_bool) == Some(true);
            let exit_code = match (*kind, is_error) {
                (CallKind::Shell, false) => Some(0),
                (CallKind::Shell, true) => shell_exit_code(&output),
                _ => None,
            };
            *kind = CallKind::Done;
            events.push(TurnEvent::ToolResult {
                call_id: id.to_owned(),
                exit_code,
                output: bounded(&output),
                refused: false,
                // A tool error with no exit code to show it: a tool it does not have (a bound
                // chat's Bash), an MCP error.
                failed: is_error && exit_code.is_none(),
            });
        }
        events
    }

    fn result(&mut self, event: &Value) -> Vec<TurnEvent> {
        self.ended = true;
        let failed = event.get("is_error").and_then(Value::as_bool) == Some(true)
            || str_field(event, "subtype").starts_with("error");
        if !failed {
            return Vec::new();
        }
        let text = str_field(event, "result");
        let message = if !text.trim().is_empty() {
            text.to_owned()
        } else if let Some(error) = &self.last_error {
            error.clone()
        } else {
            match str_field(event, "subtype") {
                "" => "the turn failed".to_owned(),
                subtype => subtype.to_owned(),
            }
        };
        vec![cli_failed(format!("Claude Code: {}", bounded(&message)))]
    }
}

impl StreamParser for EventParser {
    fn line(&mut self, line: &str) -> Vec<TurnEvent> {
        EventParser::line(self, line)
    }

    fn finish(&mut self, exit_code: Option<i32>) -> Vec<TurnEvent> {
        EventParser::finish(self, exit_code)
    }
}

/// The `message.content` blocks of an `assistant` or `user` event (none when it is a string).
fn content_blocks(event: &Value) -> &[Value] {
    event
        .get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A call as the turn shows it: the tool's name, what it runs, and how its result reads.
/// `Bash` is the shell (its command); an MCP tool `mcp__<server>__<tool>` is `<server>.<tool>`
/// with its arguments; any other native tool keeps its name, with its input.
fn describe_call(name: &str, input: &Value) -> (String, String, CallKind) {
    if name == "Bash" {
        return (
            "shell".to_owned(),
            str_field(input, "command").to_owned(),
            CallKind::Shell,
        );
    }
    let tool = match name
        .strip_prefix("mcp__")
        .and_then(|rest| rest.split_once("__"))
    {
        Some((server, tool)) => format!("{server}.{tool}"),
        None => name.to_owned(),
    };
    (bounded(&tool), input.to_string(), CallKind::Other)
}

/// A `tool_result`'s content: a string, or text blocks joined by newlines (other blocks as
/// their JSON).
fn result_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|block| match block.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => block.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The code a failed `Bash` result starts with (`Exit code 2\n…`), when it names one.
fn shell_exit_code(output: &str) -> Option<i32> {
    let rest = output.strip_prefix("Exit code ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    const SESSION: &str = "11111111-2222-4333-8444-555555555555";

    fn setup<'a>(bound: bool, bridge: Option<&'a str>) -> TurnSetup<'a> {
        TurnSetup {
            model: "claude-test",
            gateway_base_url: "http://127.0.0.1:4000/v1",
            bridge_command: bridge,
            builder: false,
            bound,
            runtime_dir: Path::new("/state/runner/runtimes/abc"),
            guidance: "Use project/<path>.",
            acp: None,
        }
    }

    fn env_of(launch: &Launch, name: &str) -> Option<String> {
        launch
            .env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    }

    #[test]
    fn launch_points_claude_at_the_gateway_with_the_capability_in_the_environment_only() {
        let launch = ClaudeDriver
            .launch(&setup(false, None), "awcap_secret", None)
            .unwrap();
        assert_eq!(
            env_of(&launch, "ANTHROPIC_BASE_URL").as_deref(),
            Some("http://127.0.0.1:4000")
        );
        assert_eq!(
            env_of(&launch, "ANTHROPIC_API_KEY").as_deref(),
            Some("awcap_secret")
        );
        assert_eq!(
            env_of(&launch, "CLAUDE_CONFIG_DIR").as_deref(),
            Some("/state/runner/runtimes/abc/claude")
        );
        assert_eq!(env_of(&launch, "IS_SANDBOX").as_deref(), Some("1"));
        assert_eq!(
            env_of(&launch, "CLAUDE_ENV_FILE").as_deref(),
            Some("/state/runner/runtimes/abc/claude/command-env.sh")
        );
        assert_eq!(
            env_of(&launch, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC").as_deref(),
            Some("1")
        );
        assert!(!launch.args.iter().any(|a| a.contains("awcap_secret")));
        let args = &launch.args;
        assert_eq!(
            args[..5],
            [
                "--bare",
                "-p",
                "--output-format",
                "stream-json",
                "--verbose"
            ]
        );
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(after("--model"), "claude-test");
        assert_eq!(
            after("--append-system-prompt-file"),
            "/state/runner/runtimes/abc/CLAUDE.md"
        );
        assert_eq!(
            after("--mcp-config"),
            "/state/runner/runtimes/abc/claude/mcp.json"
        );
        assert_eq!(after("--permission-mode"), "bypassPermissions");
        assert_eq!(after("--setting-sources"), "");
        assert!(args.contains(&"--strict-mcp-config".to_owned()));
        assert!(!args.contains(&"--tools".to_owned()));
        assert!(is_session_id(&after("--session-id")));
        assert!(!args.contains(&"--resume".to_owned()));
    }

    #[test]
    fn a_bound_chat_has_no_native_tools_and_a_resumed_one_names_its_session() {
        let launch = ClaudeDriver
            .launch(
                &setup(true, Some("/usr/libexec/agentworks-mcpbridge")),
                "c",
                Some(SESSION),
            )
            .unwrap();
        let args = &launch.args;
        let tools = args.iter().position(|a| a == "--tools").unwrap();
        assert_eq!(args[tools + 1], "");
        let resume = args.iter().position(|a| a == "--resume").unwrap();
        assert_eq!(args[resume + 1], SESSION);
        assert!(!args.contains(&"--session-id".to_owned()));
    }

    #[test]
    fn launch_refuses_what_claude_could_not_use() {
        let refused = |setup: &TurnSetup, resume| {
            matches!(
                ClaudeDriver.launch(setup, "c", resume),
                Err(DriverError::Config(_))
            )
        };
        assert!(refused(
            &setup(false, None),
            Some("--dangerously-load-anything")
        ));
        assert!(refused(&setup(false, None), Some("not-a-uuid")));
        let mut bad = setup(false, None);
        bad.model = " ";
        assert!(refused(&bad, None));
        let mut bad = setup(false, None);
        bad.gateway_base_url = "file:///etc/v1";
        assert!(refused(&bad, None));
        let mut bad = setup(false, None);
        bad.gateway_base_url = "http://127.0.0.1:4000/";
        assert!(refused(&bad, None));
    }

    #[test]
    fn files_are_the_instructions_and_the_bridge_named_by_variables() {
        let files = ClaudeDriver
            .files(&setup(false, Some("/opt/a \"b\"/agentworks-mcpbridge")))
            .unwrap();
        assert_eq!(files[0].path, Path::new("CLAUDE.md"));
        assert_eq!(files[0].content, "Use project/<path>.");
        assert_eq!(files[1].path, Path::new("claude/mcp.json"));
        let config: Value = serde_json::from_str(&files[1].content).unwrap();
        let bridge = &config["mcpServers"]["bridge"];
        assert_eq!(bridge["type"], "stdio");
        assert_eq!(bridge["command"], "/opt/a \"b\"/agentworks-mcpbridge");
        assert_eq!(
            bridge["env"]["AGENTWORKS_BRIDGE_TOKEN"],
            "${AGENTWORKS_BRIDGE_TOKEN}"
        );
        assert_eq!(
            bridge["env"]["AGENTWORKS_BRIDGE_URL"],
            "${AGENTWORKS_BRIDGE_URL}"
        );
        // The same every turn: nothing per turn in it.
        assert_eq!(
            ClaudeDriver
                .files(&setup(false, Some("/opt/a \"b\"/agentworks-mcpbridge")))
                .unwrap(),
            files
        );
        let none: Value =
            serde_json::from_str(&ClaudeDriver.files(&setup(false, None)).unwrap()[1].content)
                .unwrap();
        assert_eq!(none, json!({"mcpServers": {}}));
        assert!(matches!(mcp_config(Some("")), Err(DriverError::Config(_))));
        assert_eq!(files[2].path, Path::new("claude/command-env.sh"));
        assert_eq!(
            files[2].content,
            "unset ANTHROPIC_API_KEY AGENTWORKS_BRIDGE_TOKEN AGENTWORKS_BRIDGE_URL\n"
        );
    }

    #[test]
    fn new_session_ids_are_version_4_uuids() {
        let a = new_session_id();
        assert!(is_session_id(&a), "{a}");
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
        assert_ne!(a, new_session_id());
        for bad in [
            "",
            "1234",
            "11111111-2222-4333-8444-55555555555g",
            "-1111111-2222-4333-8444-555555555555",
        ] {
            assert!(!is_session_id(bad), "{bad}");
        }
    }

    fn parse(lines: &[&str]) -> Vec<TurnEvent> {
        let mut parser = EventParser::new();
        lines.iter().flat_map(|l| parser.line(l)).collect()
    }

    // The lines below are what Claude Code 2.1.337 printed against the scripted server
    // (shortened: fields the parser does not read are left out).

    #[test]
    fn a_text_turn() {
        let mut parser = EventParser::new();
        let mut events = Vec::new();
        for line in [
            r#"{"type":"system","subtype":"ui_invalidate","event":"ui.render","uuid":"e4939017-f0ee-48a8-b22c-d1ecb5417653","session_id":"11111111-2222-4333-8444-555555555555"}"#,
            r#"{"type":"system","subtype":"init","cwd":"/tmp/rt","session_id":"11111111-2222-4333-8444-555555555555","tools":["Bash","Edit","Read"],"mcp_servers":[],"model":"test-model","permissionMode":"bypassPermissions","apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.337"}"#,
            r#"{"type":"assistant","message":{"id":"msg_0","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello from the script."}],"stop_reason":null,"usage":{"input_tokens":11,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"11111111-2222-4333-8444-555555555555"}"#,
            r#"{"duration_api_ms":40,"stop_reason":"end_turn","session_id":"11111111-2222-4333-8444-555555555555","usage":{"input_tokens":11,"output_tokens":7},"is_error":false,"num_turns":1,"subtype":"success","result":"Hello from the script.","type":"result"}"#,
        ] {
            events.extend(parser.line(line));
        }
        events.extend(parser.finish(Some(0)));
        assert_eq!(
            events,
            [
                TurnEvent::Session {
                    session_id: SESSION.to_owned()
                },
                TurnEvent::Text {
                    text: "Hello from the script.".to_owned()
                },
            ]
        );
    }

    #[test]
    fn a_shell_call_an_mcp_call_and_a_refused_native_tool() {
        let events = parse(&[
            r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"cat project/hello.txt\n  | head","description":"read"}}]}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"hello there","is_error":false}]},"tool_use_result":{"stdout":"hello there","stderr":""}}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_2","name":"mcp__bridge__echo","input":{"text":"ping"}}]},"tool_use_meta":[{"id":"toolu_2","tool_name":"echo"}]}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_2","type":"tool_result","content":[{"type":"text","text":"echo: ping"}]}]}}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_3","name":"Bash","input":{"command":"false"}}]}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"Exit code 127\n/bin/bash: nope: not found","is_error":true,"tool_use_id":"toolu_3"}]}}"#,
            r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"toolu_4","name":"Bash","input":{"command":"echo hi"}}]}}"#,
            r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","content":"<tool_use_error>Error: No such tool available: Bash. Bash is disabled for this session, in subagents as well as here.</tool_use_error>","is_error":true,"tool_use_id":"toolu_4"}]}}"#,
        ]);
        let call = |id: &str, tool: &str, command: &str| TurnEvent::ToolCall {
            call_id: id.to_owned(),
            tool: tool.to_owned(),
            command: command.to_owned(),
        };
        let result = |id: &str, exit_code, output: &str| TurnEvent::ToolResult {
            call_id: id.to_owned(),
            exit_code,
            output: output.to_owned(),
            refused: false,
            failed: false,
        };
        assert_eq!(
            events,
            [
                call("toolu_1", "shell", "cat project/hello.txt | head"),
                result("toolu_1", Some(0), "hello there"),
                call("toolu_2", "bridge.echo", r#"{"text":"ping"}"#),
                result("toolu_2", None, "echo: ping"),
                call("toolu_3", "shell", "false"),
                result(
                    "toolu_3",
                    Some(127),
                    "Exit code 127\n/bin/bash: nope: not found"
                ),
                call("toolu_4", "shell", "echo hi"),
                // No exit code to show the error: the result says it failed.
                TurnEvent::ToolResult {
                    call_id: "toolu_4".to_owned(),
                    exit_code: None,
                    output: "<tool_use_error>Error: No such tool available: Bash. Bash is disabled for this session, in subagents as well as here.</tool_use_error>".to_owned(),
                    refused: false,
                    failed: true,
                },
            ]
        );
    }

    #[test]
    fn a_refused_key_is_the_turns_failure_not_its_text() {
        let mut parser = EventParser::new();
        let mut events = Vec::new();
        for line in [
            r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":2,"retry_delay_ms":621,"error_status":401,"error":"authentication_failed"}"#,
            r#"{"type":"assistant","message":{"id":"x","model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"Invalid API key · Fix external API key"}]},"error":"authentication_failed","is_api_error_message":true,"api_error_status":401}"#,
            r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":401,"result":"Invalid API key · Fix external API key","stop_reason":"stop_sequence"}"#,
        ] {
            events.extend(parser.line(line));
        }
        events.extend(parser.finish(Some(1)));
        assert_eq!(
            events,
            [cli_failed(
                "Claude Code: Invalid API key · Fix external API key".to_owned()
            )]
        );
    }

    #[test]
    fn an_exit_before_the_result_is_a_failure() {
        let mut parser = EventParser::new();
        parser.line(&format!(
            r#"{{"type":"system","subtype":"init","session_id":"{SESSION}"}}"#
        ));
        parser.line(
            r#"{"type":"system","subtype":"api_retry","error_status":529,"error":"overloaded"}"#,
        );
        assert_eq!(
            parser.finish(Some(1)),
            [cli_failed(
                "Claude Code exited with status 1 before the turn ended: the model API answered 529 (overloaded)"
                    .to_owned()
            )]
        );
        let mut killed = EventParser::new();
        assert_eq!(
            killed.finish(None),
            [cli_failed(
                "Claude Code was killed before the turn ended".to_owned()
            )]
        );
    }

    #[test]
    fn other_lines_and_hostile_ones_are_skipped() {
        assert!(
            parse(&[
                "",
                "[claude-code:unrecognized_model] {\"model\":\"test-model\"}",
                r#"{"type":"system","subtype":"init","session_id":"--resume-me"}"#,
                r#"{"type":"system","subtype":"init"}"#,
                r#"{"type":"assistant","message":{"content":"a string"}}"#,
                r#"{"type":"assistant","message":{"content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"  "}]}}"#,
                r#"{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Bash","input":{"command":"no id"}}]}}"#,
                r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"never-called","content":"x"}]}}"#,
                r#"{"type":"user","message":{"content":"Remember zebra."}}"#,
                r#"{"type":"stream_event","event":{}}"#,
                r#"[1,2,3]"#,
                r#"{"type":"result","subtype":"success","is_error":false}"#,
            ])
            .is_empty()
        );
    }

    #[test]
    fn a_result_is_reported_once_and_long_output_is_bounded() {
        let big = "é".repeat(crate::driver::MAX_TOOL_OUTPUT_BYTES);
        let call = json!({"type": "assistant", "message": {"content": [
            {"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "project/a"}}
        ]}})
        .to_string();
        let result = json!({"type": "user", "message": {"content": [
            {"type": "tool_result", "tool_use_id": "t", "content": big}
        ]}})
        .to_string();
        let events = parse(&[&call, &call, &result, &result]);
        assert_eq!(events.len(), 2, "{events:?}");
        let TurnEvent::ToolCall { tool, command, .. } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (tool.as_str(), command.as_str()),
            ("Read", r#"{"file_path":"project/a"}"#)
        );
        let TurnEvent::ToolResult {
            output, exit_code, ..
        } = &events[1]
        else {
            panic!("{events:?}")
        };
        assert_eq!(*exit_code, None);
        assert!(output.len() <= crate::driver::MAX_TOOL_OUTPUT_BYTES);
        assert!(output.ends_with(crate::driver::TRUNCATED));
    }
}
