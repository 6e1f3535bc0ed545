//! The Codex driver: Codex (`@openai/codex`, tested at 0.171.0) run as `codex exec --json`, its
//! configuration in `CODEX_HOME`, talking the Responses API to runnerd's model gateway.
//!
//! Owns: the `config.toml` written to the turn's `CODEX_HOME` ([`config_toml`]), the command line
//! after the executable ([`args`]), and the translation of Codex's JSONL stdout into the turn's
//! events ([`EventParser`]). The shapes were read from the real 0.171.0 binary (see
//! `/work/notes/codex.md` and `crates/runner/tests/codex_cli.rs`, which runs it).
//!
//! Must never: put a key's value anywhere (the config names the environment variable that holds
//! the turn's capability, never the capability itself, and never the operator's key), turn on
//! Codex's own sandbox or approval prompts (ours is the boundary, see [`config_toml`]), or let a
//! line Codex prints make the parser fail: anything it does not understand is skipped.

use std::collections::{BTreeMap, HashSet};

use agentworks_contract::runnerd::TurnEvent;
use serde::Serialize;
use serde_json::Value;

use crate::bridge;
use crate::driver::{
    BRIDGE_SERVER, CliDriver, Conversation, DriverError, Generated, Launch, StreamParser,
    TurnSetup, bounded, cli_failed, is_env_name, one_line, str_field,
};
use crate::gateway::KeyHeader;

/// The model provider's id in the generated config (`model_provider = "agentworks"`).
pub const PROVIDER_ID: &str = "agentworks";

pub use crate::driver::MAX_TOOL_OUTPUT_BYTES;

/// How long Codex waits for one bridge tool call. A bridge call may be a shell command run back
/// in runnerd or on a laptop; the turn's own timeout bounds the whole turn anyway.
const BRIDGE_TOOL_TIMEOUT_SECS: u64 = 600;

/// What the Codex driver needs to write a turn's config.
#[derive(Debug, Clone)]
pub struct CodexConfig<'a> {
    /// The model name sent upstream (`model = …`).
    pub model: &'a str,
    /// runnerd's model gateway, e.g. `http://127.0.0.1:PORT/v1` (Codex appends `/responses`).
    pub gateway_base_url: &'a str,
    /// The environment variable holding the turn's capability (Codex's `env_key`), e.g.
    /// `AGENTWORKS_MODEL_KEY`. Codex sends its value as `Authorization: Bearer …`.
    pub key_env: &'a str,
    /// The stdio MCP server named `bridge` (`agentworks-mcpbridge`), when the turn has one.
    pub bridge: Option<BridgeServer<'a>>,
    /// Builder mode (the project writable) or Run. Codex's config is the same in both: the mode
    /// is enforced by our sandbox's Landlock rules and told to the model by the generated
    /// instructions, not by Codex (its own sandbox is off, see [`config_toml`]).
    pub builder: bool,
    /// The chat is bound to a laptop folder: every native tool that reaches files or runs
    /// commands here is off ([`config_toml`]), so the bridge's tools are the CLI's only hands.
    pub bound: bool,
}

/// A stdio MCP server Codex spawns: the bridge.
#[derive(Debug, Clone)]
pub struct BridgeServer<'a> {
    pub command: &'a str,
    pub args: Vec<String>,
    /// Values written into the config (`env`). Never a per-turn secret: the config's hash is
    /// part of the session key, and the file stays in the runtime after the turn.
    pub env: Vec<(String, String)>,
    /// Variables passed on from Codex's own environment (`env_vars`): the bridge capability
    /// and runnerd's URL, which change every turn. Codex starts an MCP server with a cleared
    /// environment (only HOME, PATH and these; seen with 0.171), and these are kept out of the
    /// commands Codex runs (`shell_environment_policy.exclude`).
    pub env_vars: Vec<String>,
}

/// Why the Codex config could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CodexError {
    #[error("the Codex provider has no model name")]
    EmptyModel,
    #[error("the model gateway's base URL {url:?} is not an http:// or https:// URL")]
    GatewayUrl { url: String },
    #[error(
        "{name:?} is not an environment variable name Codex can read the capability from \
         (letters, digits and '_', not starting with a digit)"
    )]
    KeyEnv { name: String },
    #[error("the bridge's command is empty")]
    BridgeCommand,
    #[error("the bridge's environment has an invalid variable name {name:?}")]
    BridgeEnv { name: String },
    #[error("the Codex config could not be written as TOML: {0}")]
    Toml(#[from] toml::ser::Error),
}

/// `config.toml` as Codex 0.171 reads it (`--strict-config` accepts every key below; the test
/// runs the real binary with it).
#[derive(Serialize)]
struct ConfigFile<'a> {
    model: &'a str,
    model_provider: &'a str,
    /// Codex's own approvals and sandbox are off: the turn runs inside agentworks' sandbox
    /// (Landlock, seccomp, a cgroup; crates/sandbox), which is the boundary. Codex's sandbox
    /// (bubblewrap/Landlock of its own) would be a second, weaker policy that fails or prompts
    /// inside ours, and nobody is there to approve a prompt in `exec`.
    approval_policy: &'a str,
    sandbox_mode: &'a str,
    check_for_update_on_startup: bool,
    /// No usage analytics or feedback uploads to OpenAI.
    analytics: Enabled,
    feedback: Enabled,
    /// No prompt history file (`history.jsonl`); the session files that resume reads stay.
    history: History<'a>,
    /// `"disabled"` in a bound turn; the default otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    web_search: Option<&'a str>,
    features: Features,
    shell_environment_policy: ShellEnvironmentPolicy<'a>,
    model_providers: BTreeMap<&'a str, ModelProvider<'a>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    mcp_servers: BTreeMap<&'a str, McpServer<'a>>,
}

#[derive(Serialize)]
struct Enabled {
    enabled: bool,
}

#[derive(Serialize)]
struct History<'a> {
    persistence: &'a str,
}

#[derive(Serialize)]
struct Features {
    /// Plugins on, Codex runs `git ls-remote https://github.com/openai/plugins.git` at every
    /// start (seen with strace on 0.171): network traffic nobody asked for.
    plugins: bool,
    /// A bound turn's native tools, all off (checked against 0.171's request, which then
    /// offers no `exec_command`, `write_stdin`, `view_image`, agents or `apply_patch`; see
    /// `crates/runner/tests/codex_cli.rs`). Unset (Codex's defaults) in server mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    shell_tool: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    apply_patch_freeform: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    view_image: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    multi_agent: Option<bool>,
}

#[derive(Serialize)]
struct ShellEnvironmentPolicy<'a> {
    /// Codex's default excludes (names containing KEY, SECRET or TOKEN) dropped from the
    /// environment of the commands it runs: 0.171 ignores them unless told not to (seen: a
    /// command's `env` showed `OTHER_API_KEY` without this).
    ignore_default_excludes: bool,
    /// The capability stays out of those commands whatever its variable is called.
    exclude: Vec<&'a str>,
}

#[derive(Serialize)]
struct ModelProvider<'a> {
    name: &'a str,
    base_url: &'a str,
    env_key: &'a str,
    wire_api: &'a str,
}

#[derive(Serialize)]
struct McpServer<'a> {
    command: &'a str,
    args: &'a [String],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<&'a str, &'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    env_vars: &'a [String],
    /// The turn fails when the bridge does not start, rather than running without its tools.
    required: bool,
    tool_timeout_sec: u64,
}

/// The `config.toml` written to the turn's `CODEX_HOME`: the `agentworks` model provider (the
/// gateway's base URL, the capability's variable, the Responses API) selected with the model,
/// Codex's sandbox and approvals off, no update check, analytics, feedback or plugin sync, and the
/// bridge under `[mcp_servers.bridge]`. Serialized with `toml`, so every value is escaped.
pub fn config_toml(config: &CodexConfig) -> Result<String, CodexError> {
    if config.model.trim().is_empty() {
        return Err(CodexError::EmptyModel);
    }
    let url = config.gateway_base_url;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(CodexError::GatewayUrl {
            url: url.to_owned(),
        });
    }
    if !is_env_name(config.key_env) {
        return Err(CodexError::KeyEnv {
            name: config.key_env.to_owned(),
        });
    }

    let mut mcp_servers = BTreeMap::new();
    let mut exclude = vec![config.key_env];
    if let Some(bridge) = &config.bridge {
        if bridge.command.is_empty() {
            return Err(CodexError::BridgeCommand);
        }
        let mut env = BTreeMap::new();
        for (name, value) in &bridge.env {
            if !is_env_name(name) {
                return Err(CodexError::BridgeEnv { name: name.clone() });
            }
            env.insert(name.as_str(), value.as_str());
        }
        for name in &bridge.env_vars {
            if !is_env_name(name) {
                return Err(CodexError::BridgeEnv { name: name.clone() });
            }
            exclude.push(name.as_str());
        }
        mcp_servers.insert(
            BRIDGE_SERVER,
            McpServer {
                command: bridge.command,
                args: &bridge.args,
                env,
                env_vars: &bridge.env_vars,
                required: true,
                tool_timeout_sec: BRIDGE_TOOL_TIMEOUT_SECS,
            },
        );
    }

    let file = ConfigFile {
        model: config.model,
        model_provider: PROVIDER_ID,
        approval_policy: "never",
        sandbox_mode: "danger-full-access",
        check_for_update_on_startup: false,
        analytics: Enabled { enabled: false },
        feedback: Enabled { enabled: false },
        history: History {
            persistence: "none",
        },
        web_search: config.bound.then_some("disabled"),
        features: Features {
            plugins: false,
            shell_tool: config.bound.then_some(false),
            apply_patch_freeform: config.bound.then_some(false),
            view_image: config.bound.then_some(false),
            multi_agent: config.bound.then_some(false),
        },
        shell_environment_policy: ShellEnvironmentPolicy {
            ignore_default_excludes: false,
            exclude,
        },
        model_providers: BTreeMap::from([(
            PROVIDER_ID,
            ModelProvider {
                name: PROVIDER_ID,
                base_url: url,
                env_key: config.key_env,
                wire_api: "responses",
            },
        )]),
        mcp_servers,
    };
    Ok(toml::to_string(&file)?)
}

/// The Codex dialect as a [`CliDriver`]: `AGENTS.md` and `codex/config.toml` in the runtime,
/// `CODEX_HOME` pointing at the latter's folder, the capability in [`MODEL_KEY_ENV`].
pub struct CodexDriver;

/// The environment variable Codex reads its model API key from: the turn's capability, never
/// the operator's key.
pub const MODEL_KEY_ENV: &str = "AGENTWORKS_MODEL_KEY";

impl CliDriver for CodexDriver {
    fn upstream_auth(&self) -> KeyHeader {
        KeyHeader::Bearer
    }

    fn files(&self, setup: &TurnSetup) -> Result<Vec<Generated>, DriverError> {
        let config = config_toml(&CodexConfig {
            model: setup.model,
            gateway_base_url: setup.gateway_base_url,
            key_env: MODEL_KEY_ENV,
            // The bridge's capability and URL change every turn: they reach it through Codex's
            // environment, never the config (whose hash is part of the session key).
            bridge: setup.bridge_command.map(|command| BridgeServer {
                command,
                args: Vec::new(),
                env: Vec::new(),
                env_vars: vec![bridge::URL_ENV.to_owned(), bridge::TOKEN_ENV.to_owned()],
            }),
            builder: setup.builder,
            bound: setup.bound,
        })
        .map_err(|e| DriverError::Config(format!("cannot write Codex's config: {e}")))?;
        Ok(vec![
            Generated {
                path: "AGENTS.md".into(),
                content: setup.guidance.to_owned(),
            },
            Generated {
                path: "codex/config.toml".into(),
                content: config,
            },
        ])
    }

    fn launch(
        &self,
        setup: &TurnSetup,
        capability: &str,
        resume: Option<&str>,
    ) -> Result<Launch, DriverError> {
        Ok(Launch {
            args: args(resume),
            env: vec![
                ("CODEX_HOME".into(), setup.runtime_dir.join("codex").into()),
                (MODEL_KEY_ENV.into(), capability.into()),
            ],
        })
    }

    fn conversation(&self, _setup: &TurnSetup, _resume: Option<&str>) -> Conversation {
        Conversation::PromptOnStdin(Box::new(EventParser::new()))
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

/// The arguments after the executable: `exec --json --skip-git-repo-check`, then with `resume`
/// `resume -- <thread id>`, and last `-`: the prompt is read from stdin (never an argument,
/// which other local users could read in `/proc`). The `--` keeps a thread id that starts with
/// `-` from being read as a flag.
pub fn args(resume: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = ["exec", "--json", "--skip-git-repo-check"]
        .into_iter()
        .map(String::from)
        .collect();
    if let Some(thread_id) = resume {
        args.extend(["resume".to_owned(), "--".to_owned(), thread_id.to_owned()]);
    }
    args.push("-".to_owned());
    args
}

/// Turns `codex exec --json` stdout lines into the turn's events.
///
/// Codex 0.171 prints one JSON object a line: `thread.started`, `turn.started`, `item.started`
/// / `item.updated` / `item.completed` (with an `item` of a `type`), `turn.completed` (with
/// `usage`), `turn.failed` (with `error.message`), and `error` (a `message`; also each retry's
/// "Reconnecting... 1/5", so not the end of the turn: the turn's failure is `turn.failed`).
#[derive(Debug, Default)]
pub struct EventParser {
    /// The thread's token totals before this turn (see [`EventParser::with_usage_baseline`]).
    baseline: (u64, u64),
    /// Items whose [`TurnEvent::ToolCall`] went out, so their completion is a result only.
    called: HashSet<String>,
    /// The last `error` message, for a turn that ends without `turn.failed`.
    last_error: Option<String>,
    /// `turn.completed` or `turn.failed` was seen.
    turn_ended: bool,
}

impl EventParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser for a resumed thread. Codex's `turn.completed` usage is the thread's running
    /// total (0.171 adds the earlier turns of a resumed thread), so the turn's own tokens are that
    /// minus the total the previous turn reported.
    pub fn with_usage_baseline(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            baseline: (input_tokens, output_tokens),
            ..Self::default()
        }
    }

    /// One stdout line: the events it makes (none for lines that are not Codex's JSON events).
    pub fn line(&mut self, line: &str) -> Vec<TurnEvent> {
        let Ok(event) = serde_json::from_str::<Value>(line.trim()) else {
            tracing::debug!(line, "codex printed a line that is not JSON");
            return Vec::new();
        };
        let kind = str_field(&event, "type");
        match kind {
            "thread.started" => match event.get("thread_id").and_then(Value::as_str) {
                Some(id) => vec![TurnEvent::Session {
                    session_id: id.to_owned(),
                }],
                None => Vec::new(),
            },
            "item.started" | "item.completed" => match event.get("item") {
                Some(item) => self.item(item, kind == "item.completed"),
                None => Vec::new(),
            },
            "turn.completed" => {
                self.turn_ended = true;
                let usage = event.get("usage");
                let count = |name| {
                    usage
                        .and_then(|u| u.get(name))
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                };
                vec![TurnEvent::Usage {
                    input_tokens: count("input_tokens").saturating_sub(self.baseline.0),
                    output_tokens: count("output_tokens").saturating_sub(self.baseline.1),
                }]
            }
            "turn.failed" => {
                self.turn_ended = true;
                let message = event
                    .get("error")
                    .map(|e| str_field(e, "message"))
                    .filter(|m| !m.is_empty())
                    .or(self.last_error.as_deref())
                    .unwrap_or("the turn failed")
                    .to_owned();
                vec![cli_failed(format!("Codex: {message}"))]
            }
            "error" => {
                let message = str_field(&event, "message");
                tracing::debug!(message, "codex reported an error");
                self.last_error = Some(message.to_owned());
                Vec::new()
            }
            _ => {
                tracing::debug!(kind, "codex event skipped");
                Vec::new()
            }
        }
    }

    /// Codex's stdout ended (the process exited with `exit_code`): a [`TurnEvent::Error`] when the
    /// turn never completed or failed, so a crash is never taken for an answer.
    pub fn finish(&mut self, exit_code: Option<i32>) -> Vec<TurnEvent> {
        if self.turn_ended {
            return Vec::new();
        }
        self.turn_ended = true;
        let status = match exit_code {
            Some(code) => format!("exited with status {code}"),
            None => "was killed".to_owned(),
        };
        let message = match &self.last_error {
            Some(error) => format!("Codex {status} before the turn ended: {error}"),
            None => format!("Codex {status} before the turn ended"),
        };
        vec![cli_failed(message)]
    }

    fn item(&mut self, item: &Value, completed: bool) -> Vec<TurnEvent> {
        let id = str_field(item, "id");
        let kind = str_field(item, "type");
        let call = match kind {
            "agent_message" if completed => {
                return vec![TurnEvent::Text {
                    text: str_field(item, "text").to_owned(),
                }];
            }
            "command_execution" => ToolItem {
                tool: "shell".to_owned(),
                command: str_field(item, "command").to_owned(),
                exit_code: item
                    .get("exit_code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok()),
                output: str_field(item, "aggregated_output").to_owned(),
            },
            "mcp_tool_call" => ToolItem {
                tool: format!("{}.{}", str_field(item, "server"), str_field(item, "tool")),
                command: item
                    .get("arguments")
                    .map(Value::to_string)
                    .unwrap_or_default(),
                exit_code: None,
                output: mcp_output(item),
            },
            "file_change" => {
                let changes = file_changes(item);
                ToolItem {
                    tool: "apply_patch".to_owned(),
                    output: format!("{}: {changes}", str_field(item, "status")),
                    command: changes,
                    exit_code: None,
                }
            }
            _ => {
                tracing::debug!(kind, completed, "codex item skipped");
                return Vec::new();
            }
        };

        let mut events = Vec::new();
        // A call that only completes (a file change or a declined command may come without
        // `item.started`) still shows as a call, then its result.
        if self.called.insert(id.to_owned()) {
            events.push(TurnEvent::ToolCall {
                call_id: id.to_owned(),
                tool: call.tool,
                command: bounded(&one_line(&call.command)),
            });
        }
        if completed {
            events.push(TurnEvent::ToolResult {
                call_id: id.to_owned(),
                exit_code: call.exit_code,
                output: bounded(&call.output),
                refused: false,
                failed: call.exit_code.is_none() && str_field(item, "status") == "failed",
            });
        }
        events
    }
}

/// A tool item as the turn shows it.
struct ToolItem {
    tool: String,
    command: String,
    exit_code: Option<i32>,
    output: String,
}

/// An MCP call's result: its text content blocks, or its error.
fn mcp_output(item: &Value) -> String {
    if let Some(error) = item.get("error").filter(|e| !e.is_null()) {
        return format!("error: {}", str_field(error, "message"));
    }
    let Some(content) = item
        .get("result")
        .and_then(|r| r.get("content"))
        .and_then(Value::as_array)
    else {
        return String::new();
    };
    content
        .iter()
        .map(|block| match block.get("text").and_then(Value::as_str) {
            Some(text) => text.to_owned(),
            None => block.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A file change's paths with their kinds: `add /p/a.txt, update /p/b.txt`.
fn file_changes(item: &Value) -> String {
    item.get("changes")
        .and_then(Value::as_array)
        .map(|changes| {
            changes
                .iter()
                .map(|c| format!("{} {}", str_field(c, "kind"), str_field(c, "path")))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config<'a>(bridge: Option<BridgeServer<'a>>) -> CodexConfig<'a> {
        CodexConfig {
            model: "gpt-test",
            gateway_base_url: "http://127.0.0.1:4000/v1",
            key_env: "AGENTWORKS_MODEL_KEY",
            bridge,
            builder: false,
            bound: false,
        }
    }

    #[test]
    fn config_selects_the_gateway_provider_with_codex_sandbox_and_approvals_off() {
        let text = config_toml(&config(None)).unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["model"].as_str(), Some("gpt-test"));
        assert_eq!(parsed["model_provider"].as_str(), Some("agentworks"));
        assert_eq!(parsed["approval_policy"].as_str(), Some("never"));
        assert_eq!(parsed["sandbox_mode"].as_str(), Some("danger-full-access"));
        let provider = &parsed["model_providers"]["agentworks"];
        assert_eq!(
            provider["base_url"].as_str(),
            Some("http://127.0.0.1:4000/v1")
        );
        assert_eq!(provider["env_key"].as_str(), Some("AGENTWORKS_MODEL_KEY"));
        assert_eq!(provider["wire_api"].as_str(), Some("responses"));
        assert_eq!(parsed["analytics"]["enabled"].as_bool(), Some(false));
        assert_eq!(parsed["features"]["plugins"].as_bool(), Some(false));
        let policy = &parsed["shell_environment_policy"];
        assert_eq!(policy["ignore_default_excludes"].as_bool(), Some(false));
        assert_eq!(policy["exclude"][0].as_str(), Some("AGENTWORKS_MODEL_KEY"));
        assert!(!parsed.contains_key("mcp_servers"));
    }

    #[test]
    fn config_escapes_the_bridge_values() {
        let tricky = "a\"b\nc = 'd' ]\\".to_owned();
        let text = config_toml(&config(Some(BridgeServer {
            command: "/usr/libexec/agentworks-mcpbridge",
            args: vec![tricky.clone(), "--x".to_owned()],
            env: vec![("AGENTWORKS_BRIDGE_URL".to_owned(), tricky.clone())],
            env_vars: vec!["AGENTWORKS_BRIDGE_TOKEN".to_owned()],
        })))
        .unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let bridge = &parsed["mcp_servers"]["bridge"];
        assert_eq!(
            bridge["command"].as_str(),
            Some("/usr/libexec/agentworks-mcpbridge")
        );
        assert_eq!(bridge["args"][0].as_str(), Some(tricky.as_str()));
        assert_eq!(
            bridge["env"]["AGENTWORKS_BRIDGE_URL"].as_str(),
            Some(tricky.as_str())
        );
        assert_eq!(bridge["required"].as_bool(), Some(true));
        // Passed on to the bridge, kept from the commands.
        assert_eq!(
            bridge["env_vars"][0].as_str(),
            Some("AGENTWORKS_BRIDGE_TOKEN")
        );
        let exclude = &parsed["shell_environment_policy"]["exclude"];
        assert_eq!(exclude[1].as_str(), Some("AGENTWORKS_BRIDGE_TOKEN"));
        // Only one top-level key per name: the tricky value did not inject anything.
        assert!(!parsed.contains_key("c"));
    }

    #[test]
    fn config_refuses_what_codex_could_not_use() {
        let mut bad = config(None);
        bad.key_env = "MODEL KEY";
        assert!(matches!(config_toml(&bad), Err(CodexError::KeyEnv { .. })));
        let mut bad = config(None);
        bad.gateway_base_url = "file:///etc/passwd";
        assert!(matches!(
            config_toml(&bad),
            Err(CodexError::GatewayUrl { .. })
        ));
        let mut bad = config(None);
        bad.model = " ";
        assert!(matches!(config_toml(&bad), Err(CodexError::EmptyModel)));
        let bad = config(Some(BridgeServer {
            command: "bridge",
            args: Vec::new(),
            env: vec![("A=B".to_owned(), "x".to_owned())],
            env_vars: Vec::new(),
        }));
        assert!(matches!(
            config_toml(&bad),
            Err(CodexError::BridgeEnv { .. })
        ));
    }

    #[test]
    fn args_read_the_prompt_from_stdin_and_resume_by_thread_id() {
        assert_eq!(args(None), ["exec", "--json", "--skip-git-repo-check", "-"]);
        assert_eq!(
            args(Some("01a2-thread")),
            [
                "exec",
                "--json",
                "--skip-git-repo-check",
                "resume",
                "--",
                "01a2-thread",
                "-"
            ]
        );
    }

    fn parse(lines: &[&str]) -> Vec<TurnEvent> {
        let mut parser = EventParser::new();
        lines.iter().flat_map(|l| parser.line(l)).collect()
    }

    // The lines below are what codex-cli 0.171.0 printed against the scripted server.

    #[test]
    fn a_text_turn() {
        let events = parse(&[
            r#"{"type":"thread.started","thread_id":"01a251be-0ce6-7033-8d39-3a524ecc8fcf"}"#,
            r#"{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata for `test-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues."}}"#,
            r#"{"type":"turn.started"}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Hello from the script."}}"#,
            r#"{"type":"turn.completed","usage":{"input_tokens":11,"cached_input_tokens":0,"cache_write_input_tokens":0,"output_tokens":7,"reasoning_output_tokens":0}}"#,
        ]);
        assert_eq!(
            events,
            [
                TurnEvent::Session {
                    session_id: "01a251be-0ce6-7033-8d39-3a524ecc8fcf".to_owned()
                },
                TurnEvent::Text {
                    text: "Hello from the script.".to_owned()
                },
                TurnEvent::Usage {
                    input_tokens: 11,
                    output_tokens: 7
                },
            ]
        );
    }

    #[test]
    fn a_command_an_mcp_call_and_a_file_change() {
        let events = parse(&[
            r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc 'cat hello.txt'","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc 'cat hello.txt'","aggregated_output":"hello there\n","exit_code":0,"status":"completed"}}"#,
            r#"{"type":"item.started","item":{"id":"item_2","type":"mcp_tool_call","server":"bridge","tool":"echo","arguments":{"text":"ping"},"result":null,"error":null,"status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_2","type":"mcp_tool_call","server":"bridge","tool":"echo","arguments":{"text":"ping"},"result":{"content":[{"type":"text","text":"echo: ping"}],"structured_content":null},"error":null,"status":"completed"}}"#,
            r#"{"type":"item.started","item":{"id":"item_3","type":"file_change","changes":[{"path":"/var/tmp/cx/work/new.txt","kind":"add"}],"status":"in_progress"}}"#,
            r#"{"type":"item.completed","item":{"id":"item_3","type":"file_change","changes":[{"path":"/var/tmp/cx/work/new.txt","kind":"add"}],"status":"completed"}}"#,
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
                call("item_1", "shell", "/bin/bash -lc 'cat hello.txt'"),
                result("item_1", Some(0), "hello there\n"),
                call("item_2", "bridge.echo", r#"{"text":"ping"}"#),
                result("item_2", None, "echo: ping"),
                call("item_3", "apply_patch", "add /var/tmp/cx/work/new.txt"),
                result("item_3", None, "completed: add /var/tmp/cx/work/new.txt"),
            ]
        );
    }

    #[test]
    fn a_completion_without_a_start_is_a_call_and_its_result() {
        let events = parse(&[
            r#"{"type":"item.completed","item":{"id":"item_5","type":"file_change","changes":[{"path":"/p/a.txt","kind":"update"},{"path":"/p/b.txt","kind":"delete"}],"status":"failed"}}"#,
        ]);
        assert_eq!(
            events,
            [
                TurnEvent::ToolCall {
                    call_id: "item_5".to_owned(),
                    tool: "apply_patch".to_owned(),
                    command: "update /p/a.txt, delete /p/b.txt".to_owned()
                },
                TurnEvent::ToolResult {
                    call_id: "item_5".to_owned(),
                    exit_code: None,
                    output: "failed: update /p/a.txt, delete /p/b.txt".to_owned(),
                    refused: false,
                    failed: true,
                },
            ]
        );
    }

    #[test]
    fn retries_are_not_failures_and_turn_failed_is() {
        let mut parser = EventParser::new();
        let mut events = Vec::new();
        for line in [
            r#"{"type":"error","message":"Reconnecting... 1/2 (stream disconnected before completion: scripted failure)"}"#,
            r#"{"type":"error","message":"stream disconnected before completion: scripted failure"}"#,
            r#"{"type":"turn.failed","error":{"message":"stream disconnected before completion: scripted failure"}}"#,
        ] {
            events.extend(parser.line(line));
        }
        events.extend(parser.finish(Some(1)));
        assert_eq!(
            events,
            [TurnEvent::Error {
                code: "cli_failed".to_owned(),
                message: "Codex: stream disconnected before completion: scripted failure"
                    .to_owned()
            }]
        );
    }

    #[test]
    fn an_exit_before_the_turn_ended_is_a_failure() {
        let mut parser = EventParser::new();
        parser.line(r#"{"type":"thread.started","thread_id":"t"}"#);
        parser.line(r#"{"type":"error","message":"config broke"}"#);
        let events = parser.finish(Some(1));
        assert_eq!(
            events,
            [TurnEvent::Error {
                code: "cli_failed".to_owned(),
                message: "Codex exited with status 1 before the turn ended: config broke"
                    .to_owned()
            }]
        );
        let mut done = EventParser::new();
        done.line(r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}"#);
        assert!(done.finish(Some(0)).is_empty());
    }

    #[test]
    fn resumed_usage_counts_only_this_turn() {
        let mut parser = EventParser::with_usage_baseline(22, 14);
        let events = parser.line(
            r#"{"type":"turn.completed","usage":{"input_tokens":33,"cached_input_tokens":0,"output_tokens":21}}"#,
        );
        assert_eq!(
            events,
            [TurnEvent::Usage {
                input_tokens: 11,
                output_tokens: 7
            }]
        );
    }

    #[test]
    fn other_lines_are_skipped() {
        assert!(
            parse(&[
                "",
                "WARNING: proceeding, even though we could not create PATH aliases",
                "2026-12-07T18:23:34Z ERROR codex_core::tools::router: error=unsupported call",
                r#"{"type":"turn.started"}"#,
                r#"{"type":"item.updated","item":{"id":"i","type":"todo_list","items":[]}}"#,
                r#"{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"hm"}}"#,
                r#"{"type":"something.new","x":1}"#,
                r#"[1,2,3]"#,
                r#"{"type":"item.started","item":{"id":"m","type":"agent_message","text":"partial"}}"#,
            ])
            .is_empty()
        );
    }

    #[test]
    fn long_output_is_bounded_and_commands_are_one_line() {
        let big = "é".repeat(MAX_TOOL_OUTPUT_BYTES);
        let line = serde_json::json!({
            "type": "item.completed",
            "item": {"id": "c", "type": "command_execution", "command": "echo a\n  echo b",
                     "aggregated_output": big, "exit_code": 0, "status": "completed"}
        })
        .to_string();
        let events = parse(&[&line]);
        let TurnEvent::ToolCall { command, .. } = &events[0] else {
            panic!("{events:?}")
        };
        assert_eq!(command, "echo a echo b");
        let TurnEvent::ToolResult { output, .. } = &events[1] else {
            panic!("{events:?}")
        };
        assert!(output.len() <= MAX_TOOL_OUTPUT_BYTES);
        assert!(output.ends_with(crate::driver::TRUNCATED));
        assert!(output.starts_with("éé"));
    }
}
