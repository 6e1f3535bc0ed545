//! `agentworksctl quickstart`: the whole daemon set in the foreground on a private state root.
//!
//! Every daemon runs as the current user, loopback only, with its sockets under `<state>/run`;
//! a demo user, a demo workflow (with a few files), a `code` project `demo-code` (the demo
//! user owns both; its chats are where the agent works, in the console at `/console/`) and a
//! `workflows:write` token are created through agentd's operator socket; Ctrl-C (or SIGTERM)
//! stops every daemon with SIGTERM and waits for it. Running it again reuses the state root
//! and the token ([`TOKEN_FILE`]). It never touches the system state root.
//!
//! What a person asked for is checked before anything is made or started: the model's URL
//! (https://, or http:// to loopback: the key would cross the network in clear), both ports
//! free, the `--config` file against the configuration's schema (an unknown key is reported
//! at its line of that file), the model's key file, each `--provider` (a driver runnerd has, or
//! an ACP agent it knows: its `[acp]` table is written too),
//! the providers' upstream URL (the same rule as the model's) and key file.
//!
//! runnerd, the fourth daemon, starts after workspaced and before agentd (agentd calls it);
//! the providers it answers (`GET /v1/providers`, each with its executable or why it is
//! unavailable) are in the banner. A provider whose executable is missing is not a reason to
//! refuse the start: runnerd keeps it as unavailable, and so does the banner.
//!
//! Once its daemons answer, it records itself for agentworksctl's other commands
//! ([`crate::deployment`]), so that `agentworksctl status` run with no configuration finds it;
//! the record is removed when it stops.
//!
//! The configuration the daemons read, `<state>/agentworks.toml`, is written on every run:
//! the `--config` file's sections (`[agentd.model]` and every other one), then quickstart's
//! own settings over them where the stack depends on them ([`FORCED_SETTINGS`]), then the
//! `--model-url`/`--model`/`--model-key-file` flags over `[agentd.model]`, then each
//! `--provider` over the `[runnerd.providers.NAME]` of its name (the file's others are kept). The result is
//! validated as the daemons will read it before anything is written. A model's key file must
//! be readable (checked at start); its content is never printed. Without a model the stack runs
//! and a turn answers `model_not_configured`.
//!
//! Everything it makes is private to the current user, whatever umask it was started with
//! (root's is usually 022): it runs, and starts the daemons, under umask 077 (as the systemd
//! units do with `UMask=0077`), and forces the state root and the documents root to 0700
//! (a state root left by an older version is tightened too); the demo files are 0600.

use agentworks_contract::runnerd::{ProviderInfo, ProvidersAnswer};
use agentworks_daemon::config::Config;
use agentworks_daemon::layout::{LayoutError, ensure_private_dir};
use agentworks_support::unix_http::{ClientError, UnixClient};
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum QuickstartError {
    #[error("{0}")]
    Ports(&'static str),
    #[error("cannot prepare {path}: {source}")]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make the quickstart state private: {0}")]
    Private(#[from] LayoutError),
    #[error(
        "{binary} was not found next to agentworksctl ({dir}); build every binary first: cargo build --bins"
    )]
    MissingBinary { binary: String, dir: PathBuf },
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("{daemon} exited during start ({status}); its log is above")]
    DiedAtStart {
        daemon: String,
        status: std::process::ExitStatus,
    },
    #[error("{daemon} did not become ready within {seconds} s")]
    NotReady { daemon: String, seconds: u64 },
    #[error("{daemon} stopped unexpectedly ({status})")]
    Died {
        daemon: String,
        status: std::process::ExitStatus,
    },
    #[error("setting up the demo failed: {0}")]
    Bootstrap(String),
    #[error("--config {path}: {reason}")]
    UserConfig { path: PathBuf, reason: String },
    #[error("the merged configuration is refused: {0}")]
    Config(#[from] agentworks_daemon::config::ConfigError),
    #[error("the key file {path} ({origin}): {reason}")]
    KeyFile {
        path: PathBuf,
        origin: &'static str,
        reason: String,
    },
    #[error("--model-url {url:?} is refused: {problem}")]
    ModelUrl { url: String, problem: &'static str },
    #[error("--provider {given:?} is refused: {problem}")]
    Provider { given: String, problem: String },
    #[error("--provider-upstream {url:?} is refused: {problem}")]
    ProviderUpstream { url: String, problem: &'static str },
    #[error("runnerd answered its health but not its providers: {0}")]
    Providers(String),
    #[error("port {port} is in use: {hint}")]
    PortInUse { port: u16, hint: &'static str },
    #[error("cannot listen on 127.0.0.1:{port} ({flag}): {source}")]
    Listen {
        port: u16,
        flag: &'static str,
        source: std::io::Error,
    },
}

impl QuickstartError {
    /// A mistake in what the person asked for (flags, the --config file, a key file, a port
    /// that is taken), as opposed to a failure while running: exit code 2 instead of 1.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            QuickstartError::Ports(_)
                | QuickstartError::UserConfig { .. }
                | QuickstartError::Config(_)
                | QuickstartError::KeyFile { .. }
                | QuickstartError::ModelUrl { .. }
                | QuickstartError::Provider { .. }
                | QuickstartError::ProviderUpstream { .. }
                | QuickstartError::PortInUse { .. }
                | QuickstartError::Listen { .. }
        )
    }
}

/// `--model-url URL --model NAME [--model-key-file FILE]`: the chat model, over the
/// `--config` file's `[agentd.model]` (its other keys, e.g. `max_tool_rounds`, are kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFlags {
    pub base_url: String,
    pub model: String,
    pub key_file: Option<PathBuf>,
}

/// The model runnerd's providers ask for when `--provider-model` is not given.
pub const DEFAULT_PROVIDER_MODEL: &str = "gpt-5.5";

/// `--provider NAME=PATH… --provider-upstream URL [--provider-key-file FILE]
/// [--provider-model NAME]`: runnerd's providers, each over the `--config` file's
/// `[runnerd.providers.NAME]` of its name. Checked by [`checked_providers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFlags {
    /// Each `--provider` as given, `NAME=PATH`.
    pub providers: Vec<String>,
    pub upstream: String,
    pub key_file: Option<PathBuf>,
    /// `None`: [`DEFAULT_PROVIDER_MODEL`].
    pub model: Option<String>,
}

/// The providers `--provider NAME=PATH` can name: NAME, the driver runnerd runs it with, and
/// for an agent that speaks ACP the `[runnerd.providers.NAME.acp]` table written beside it.
/// Every driver runnerd has but `acp` is named by itself; an ACP agent by its own name (a
/// unit test holds this list to the config's
/// [`PROVIDER_DRIVERS`](agentworks_daemon::config::PROVIDER_DRIVERS) and
/// [`ACP_AGENTS`](agentworks_daemon::config::ACP_AGENTS)).
const QUICKSTART_PROVIDERS: &[(&str, &str, Option<AcpTable>)] = &[
    ("codex", "codex", None),
    ("claude", "claude", None),
    (
        "opencode",
        "acp",
        Some(AcpTable {
            agent: "opencode",
            args: &["acp"],
            api: "chat_completions",
        }),
    ),
];

/// An ACP agent's `[acp]` table: which agent, what makes it speak ACP, what it speaks to the
/// model gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AcpTable {
    agent: &'static str,
    args: &'static [&'static str],
    api: &'static str,
}

/// One `[runnerd.providers.NAME]` table quickstart writes from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProviderTable {
    name: String,
    driver: &'static str,
    /// The `[acp]` table of an ACP agent.
    acp: Option<AcpTable>,
    /// An absolute path, or a bare name runnerd looks up on its `PATH` (quickstart's).
    executable: String,
    model: String,
    upstream: String,
    /// Absolute, checked readable.
    key_file: Option<PathBuf>,
}

/// What `agentworksctl quickstart` was asked for besides the state root.
#[derive(Debug, Clone)]
pub struct Options {
    pub ports: Ports,
    /// `--config FILE`: merged under quickstart's own settings.
    pub config: Option<PathBuf>,
    pub model: Option<ModelFlags>,
    pub providers: Option<ProviderFlags>,
}

/// The settings quickstart writes over the `--config` file, as `(section, key)` (`""`: the top
/// level), and why each must be quickstart's: the daemons find each other through sockets
/// under `<state>/run` and serve on the ports given (or removed: derived from the state root,
/// which the daemons get as `AGENTWORKS_STATE_ROOT`); every daemon runs as the current user,
/// so no other user is let in.
pub const FORCED_SETTINGS: [(&str, &str); 12] = [
    ("", "state_root"),
    ("", "documents_root"),
    ("", "runtime_dir"),
    ("workspaced", "socket"),
    ("workspaced", "allowed_users"),
    ("agentd", "listen"),
    ("agentd", "socket"),
    ("gatewayd", "listen"),
    ("gatewayd", "socket"),
    ("gatewayd", "allowed_users"),
    ("runnerd", "socket"),
    ("runnerd", "allowed_users"),
];

/// What quickstart started, printed for people and (with --json) as the first stdout line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Started {
    pub mcp_url: String,
    pub api_url: String,
    /// The executor WebSocket URL laptops dial (`agentworks executor connect --gateway`).
    pub gateway_url: Option<String>,
    pub token: String,
    /// The token's id (`agentworksctl token revoke ID`).
    pub token_id: String,
    /// The token is the one an earlier run made and stored in [`TOKEN_FILE`], still valid.
    pub token_reused: bool,
    /// Earlier quickstart tokens this run revoked when it made a new one.
    pub revoked_token_ids: Vec<String>,
    pub workflow_id: String,
    /// The `code` project (`demo-code`): chats live there.
    pub code_project_id: String,
    /// The web console, `<api_url>/console/`.
    pub console_url: String,
    /// A one-time link (15 minutes) that signs the demo user in to the console.
    pub sign_in_link: String,
    /// The model turns use, `None` when no model is configured.
    pub model: Option<String>,
    pub state_root: PathBuf,
    pub documents_root: PathBuf,
    pub agentd_socket: PathBuf,
    pub workspaced_socket: PathBuf,
    pub runnerd_socket: PathBuf,
    /// runnerd's providers as it answered them at start (each with its executable, or why it
    /// is unavailable); empty when none is configured.
    pub providers: Vec<ProviderInfo>,
    /// A ready-to-paste MCP client configuration (the common `mcpServers` shape).
    pub mcp_client_config: Value,
    /// Where this quickstart recorded itself for agentworksctl's other commands (`None`: it
    /// could not, and said why on stderr).
    pub record: Option<PathBuf>,
}

/// The demo token, in the state root (0600; the state root is 0700): every run prints the
/// same token while agentd still accepts it, so an MCP client configured once keeps working
/// across restarts. A revoked or expired one is replaced, and the earlier quickstart tokens
/// with it.
pub const TOKEN_FILE: &str = "quickstart-token";
/// The daemons' configuration in the state root, written on every run.
const CONFIG_FILE: &str = "agentworks.toml";
/// The label of the tokens quickstart makes.
const TOKEN_LABEL: &str = "quickstart";

const DEMO_FILES: [(&str, &str); 3] = [
    (
        "README.md",
        "# Demo workflow\n\nFiles here are served by agentworks through MCP.\n",
    ),
    ("code/task.py", "print('hello from the demo workflow')\n"),
    (
        "workflow.json",
        "{\"name\": \"demo\", \"steps\": [\"task\"]}\n",
    ),
];

/// The code project's name (and folder) and its one starting file.
const CODE_PROJECT: &str = "demo-code";
const CODE_FILES: [(&str, &str); 1] = [(
    "README.md",
    "# Demo code project\n\nChat with the agent about these files in the console, or connect a laptop folder.\n",
)];

/// A running daemon child, stopped with SIGTERM when dropped.
struct Daemon {
    name: &'static str,
    child: Child,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = self.child.wait();
        }
    }
}

/// The two loopback ports quickstart's daemons listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// agentd's public listener: MCP, the device login and the chat API.
    pub http: u16,
    /// gatewayd's executor WebSocket.
    pub gateway: u16,
}

impl Ports {
    /// `http`, and `gateway` or else the port after `http`.
    pub fn new(http: u16, gateway: Option<u16>) -> Result<Ports, QuickstartError> {
        let gateway = match gateway {
            Some(port) => port,
            None => http.checked_add(1).ok_or(QuickstartError::Ports(
                "--port 65535 leaves no port after it for the executor WebSocket; give --gateway-port",
            ))?,
        };
        if gateway == http {
            return Err(QuickstartError::Ports(
                "--gateway-port must differ from --port",
            ));
        }
        Ok(Ports { http, gateway })
    }
}

/// The daemons' configuration for `options` on `state_root` (absolute), checked before
/// anything is written: the `--config` file against the schema, the model's and the
/// providers' flags and key files, and the merged text validated as the daemons will read it.
fn configuration(state_root: &Path, options: &Options) -> Result<String, QuickstartError> {
    let user = match &options.config {
        Some(path) => Some(read_user_config(path)?),
        None => None,
    };
    let model = match &options.model {
        Some(flags) => Some(ModelFlags {
            key_file: match &flags.key_file {
                Some(file) => Some(check_key_file(file, "--model-key-file")?),
                None => None,
            },
            ..flags.clone()
        }),
        None => None,
    };
    let providers = match &options.providers {
        Some(flags) => checked_providers(flags)?,
        None => Vec::new(),
    };
    let cli_dir = offered_cli_dir(&binaries_dir());
    let text = config_text(
        options.ports,
        user,
        model.as_ref(),
        &providers,
        cli_dir.as_deref(),
    );
    let config = Config::from_text(&text, &state_root.join(CONFIG_FILE), &|name| {
        (name == agentworks_daemon::config::ENV_STATE_ROOT)
            .then(|| state_root.to_string_lossy().into_owned())
    })?;
    if options.model.is_none()
        && let Some(file) = config
            .agentd
            .model
            .as_ref()
            .and_then(|m| m.api_key_file.as_ref())
    {
        check_key_file(file, "[agentd.model] api_key_file")?;
    }
    // The file's providers (the flags' were checked above): runnerd reads a key file only
    // when a turn runs, too late for a mistake to be found.
    for (name, provider) in &config.runnerd.providers {
        if let Some(file) = &provider.key_file
            && !providers.iter().any(|p| &p.name == name)
        {
            check_key_file(file, "[runnerd.providers] key_file")?;
        }
    }
    Ok(text)
}

/// The `[runnerd.providers.NAME]` tables the provider flags ask for, each checked: `NAME=PATH`
/// with a driver runnerd has as NAME (the name is the driver, for now), no name twice, PATH
/// made absolute when it is a relative path (the daemons do not run in this directory; a
/// bare name stays one, for runnerd to find on its PATH), the upstream URL under the model
/// URL's rule, the key file readable. A missing executable is not refused here: runnerd
/// lists its provider as unavailable, and the banner says so.
fn checked_providers(flags: &ProviderFlags) -> Result<Vec<ProviderTable>, QuickstartError> {
    if let Some(problem) = agentworks_support::url::http_base_url_problem(&flags.upstream) {
        return Err(QuickstartError::ProviderUpstream {
            url: agentworks_daemon::config::redact_url(&flags.upstream),
            problem,
        });
    }
    let key_file = match &flags.key_file {
        Some(file) => Some(check_key_file(file, "--provider-key-file")?),
        None => None,
    };
    let model = flags
        .model
        .clone()
        .unwrap_or_else(|| DEFAULT_PROVIDER_MODEL.to_owned());
    let mut tables: Vec<ProviderTable> = Vec::new();
    for given in &flags.providers {
        let refused = |problem: String| QuickstartError::Provider {
            given: given.clone(),
            problem,
        };
        let Some((name, path)) = given.split_once('=') else {
            return Err(refused(
                "give NAME=PATH, e.g. --provider codex=/usr/local/bin/codex".into(),
            ));
        };
        let Some(&(_, driver, acp)) = QUICKSTART_PROVIDERS.iter().find(|(n, ..)| *n == name) else {
            let names: Vec<&str> = QUICKSTART_PROVIDERS.iter().map(|(n, ..)| *n).collect();
            return Err(refused(format!(
                "runnerd has no driver {name:?}; a provider's name is its driver (or, for an \
                 agent that speaks ACP, the agent's name), and runnerd has: {}",
                names.join(", ")
            )));
        };
        if tables.iter().any(|t| t.name == name) {
            return Err(refused(format!("the provider {name} is given twice")));
        }
        if path.is_empty() {
            return Err(refused(format!(
                "the executable is empty: give its path, e.g. --provider {name}=/usr/local/bin/{name}"
            )));
        }
        let executable = if path.contains('/') {
            std::path::absolute(path)
                .map_err(|e| refused(format!("cannot make {path} absolute: {e}")))?
                .to_str()
                .ok_or_else(|| refused(format!("{path} is not valid UTF-8 once made absolute")))?
                .to_owned()
        } else {
            path.to_owned()
        };
        tables.push(ProviderTable {
            name: name.to_owned(),
            driver,
            acp,
            executable,
            model: model.clone(),
            upstream: flags.upstream.clone(),
            key_file: key_file.clone(),
        });
    }
    Ok(tables)
}

/// Creates the documents root and the demo projects' first files (kept if they exist), and
/// writes the daemons' configuration `text`; answers the documents root, the configuration's
/// path and the configuration as the daemons will read it.
fn prepare(state_root: &Path, text: &str) -> Result<(PathBuf, PathBuf, Config), QuickstartError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| QuickstartError::Prepare { path, source }
    };
    let documents = state_root.join("documents");
    ensure_private_dir(&documents, 0o700)?;
    for (folder, files) in [("demo", &DEMO_FILES[..]), (CODE_PROJECT, &CODE_FILES[..])] {
        let project = documents.join(folder);
        ensure_private_dir(&project, 0o700)?;
        for (name, content) in files {
            let path = project.join(name);
            if !path.exists() {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(err(parent))?;
                }
                write_private(&path, content).map_err(err(&path))?;
            }
        }
    }
    // quickstart owns this file: rewritten each run so the flags and --config take effect.
    let config_path = state_root.join(CONFIG_FILE);
    write_private(&config_path, text).map_err(err(&config_path))?;
    // Read back exactly as the daemons will (their environment and the file's place).
    let config = daemon_config(state_root)?;
    Ok((documents, config_path, config))
}

/// Runs `change` on the sub-table `name` of `parent` (made if missing; a value there that is
/// not a table is replaced: quickstart's settings win, and it would be refused anyway).
fn with_table(parent: &mut toml::Table, name: &str, change: impl FnOnce(&mut toml::Table)) {
    let mut table = match parent.remove(name) {
        Some(toml::Value::Table(table)) => table,
        _ => toml::Table::new(),
    };
    change(&mut table);
    parent.insert(name.into(), toml::Value::Table(table));
}

/// The `--config` file as a TOML table, checked against the configuration's schema first so
/// that a typo or a mistyped value is reported at its line of the person's file, not of the
/// merged one (the merged file is validated too, once written).
fn read_user_config(path: &Path) -> Result<toml::Table, QuickstartError> {
    let refused = |reason: String| QuickstartError::UserConfig {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| refused(e.to_string()))?;
    Config::check_schema(&text).map_err(|e| refused(e.to_string()))?;
    text.parse::<toml::Table>()
        .map_err(|e| refused(format!("not valid TOML: {e}")))
}

/// The configuration quickstart's daemons read on `state_root`, as they read it: its file,
/// with `AGENTWORKS_STATE_ROOT` set to the state root and no other root from the environment.
pub fn daemon_config(state_root: &Path) -> Result<Config, agentworks_daemon::config::ConfigError> {
    Config::load_with_env(Some(&state_root.join(CONFIG_FILE)), &|name| {
        (name == agentworks_daemon::config::ENV_STATE_ROOT)
            .then(|| state_root.to_string_lossy().into_owned())
    })
}

/// Refuses a `--model-url` that would carry the key (and every prompt) where it must not go,
/// with the rule, before anything is made.
fn check_model_url(model: Option<&ModelFlags>) -> Result<(), QuickstartError> {
    let Some(flags) = model else { return Ok(()) };
    match agentworks_support::url::http_base_url_problem(&flags.base_url) {
        Some(problem) => Err(QuickstartError::ModelUrl {
            url: agentworks_daemon::config::redact_url(&flags.base_url),
            problem,
        }),
        None => Ok(()),
    }
}

/// Refuses a port another program listens on, naming the flag that changes it, before any
/// daemon starts (a daemon that cannot bind says only that its address is in use). The
/// listener is closed at once; a program taking the port in between still makes the daemon
/// fail at start, with its own log.
fn check_ports_free(ports: Ports) -> Result<(), QuickstartError> {
    let checks = [
        (
            ports.http,
            "--port",
            "give --port N (and --gateway-port M: the executor WebSocket takes the port after \
             --port unless given)",
        ),
        (
            ports.gateway,
            "--gateway-port",
            "it is the executor WebSocket's (the port after --port unless given): give \
             --gateway-port M",
        ),
    ];
    for (port, flag, hint) in checks {
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(listener) => drop(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(QuickstartError::PortInUse { port, hint });
            }
            Err(source) => return Err(QuickstartError::Listen { port, flag, source }),
        }
    }
    Ok(())
}

/// Checks that the model's key file is a readable, non-empty file and answers its absolute
/// path (the daemons do not run in this directory). Its content is never shown.
fn check_key_file(path: &Path, origin: &'static str) -> Result<PathBuf, QuickstartError> {
    let refused = |reason: String| QuickstartError::KeyFile {
        path: path.to_owned(),
        origin,
        reason,
    };
    let absolute = path
        .canonicalize()
        .map_err(|e| refused(format!("cannot be opened: {e}")))?;
    if !absolute.is_file() {
        return Err(refused("is not a regular file".into()));
    }
    let key = std::fs::read(&absolute).map_err(|e| refused(format!("cannot be read: {e}")))?;
    if key.iter().all(u8::is_ascii_whitespace) {
        return Err(refused("is empty".into()));
    }
    Ok(absolute)
}

/// The folder whose laptop CLI quickstart's agentd offers at `/v1/cli` (the console's install
/// line): the folder of the running binaries when it holds `agentworks` (a build folder, where
/// a newcomer's `cargo build --bins` put it), else `None` (agentd's default, where the
/// packages install it).
fn offered_cli_dir(binaries: &Path) -> Option<PathBuf> {
    binaries
        .join("agentworks")
        .is_file()
        .then(|| binaries.to_owned())
}

/// The daemons' configuration: `user` (the `--config` file) with quickstart's
/// [`FORCED_SETTINGS`] over it, then `model` over its `[agentd.model]`, then each of
/// `providers` as its `[runnerd.providers.NAME]` (replacing the file's of that name whole);
/// `cli_dir` is agentd's unless the file sets one.
fn config_text(
    ports: Ports,
    user: Option<toml::Table>,
    model: Option<&ModelFlags>,
    providers: &[ProviderTable],
    cli_dir: Option<&Path>,
) -> String {
    use toml::Value;
    let mut config = user.unwrap_or_default();
    for (section, key) in FORCED_SETTINGS {
        let table = if section.is_empty() {
            Some(&mut config)
        } else {
            config.get_mut(section).and_then(Value::as_table_mut)
        };
        if let Some(table) = table {
            table.remove(key);
        }
    }
    with_table(&mut config, "workspaced", |workspaced| {
        workspaced.insert("allowed_users".into(), Value::Array(Vec::new()));
    });
    with_table(&mut config, "runnerd", |runnerd| {
        runnerd.insert("allowed_users".into(), Value::Array(Vec::new()));
        if providers.is_empty() {
            return;
        }
        with_table(runnerd, "providers", |tables| {
            for provider in providers {
                let mut table = toml::Table::new();
                table.insert("driver".into(), Value::String(provider.driver.into()));
                table.insert(
                    "executable".into(),
                    Value::String(provider.executable.clone()),
                );
                table.insert("model".into(), Value::String(provider.model.clone()));
                table.insert("upstream".into(), Value::String(provider.upstream.clone()));
                if let Some(file) = &provider.key_file {
                    table.insert(
                        "key_file".into(),
                        Value::String(file.to_string_lossy().into_owned()),
                    );
                }
                if let Some(acp) = provider.acp {
                    let mut acp_table = toml::Table::new();
                    acp_table.insert("agent".into(), Value::String(acp.agent.into()));
                    acp_table.insert(
                        "args".into(),
                        Value::Array(
                            acp.args
                                .iter()
                                .map(|arg| Value::String((*arg).into()))
                                .collect(),
                        ),
                    );
                    acp_table.insert("api".into(), Value::String(acp.api.into()));
                    table.insert("acp".into(), Value::Table(acp_table));
                }
                tables.insert(provider.name.clone(), Value::Table(table));
            }
        });
    });
    with_table(&mut config, "gatewayd", |gatewayd| {
        gatewayd.insert(
            "listen".into(),
            Value::String(format!("127.0.0.1:{}", ports.gateway)),
        );
        gatewayd.insert("allowed_users".into(), Value::Array(Vec::new()));
    });
    with_table(&mut config, "agentd", |agentd| {
        agentd.insert(
            "listen".into(),
            Value::String(format!("127.0.0.1:{}", ports.http)),
        );
        if let Some(dir) = cli_dir
            && !agentd.contains_key("cli_dir")
        {
            agentd.insert(
                "cli_dir".into(),
                Value::String(dir.to_string_lossy().into_owned()),
            );
        }
        let Some(flags) = model else { return };
        with_table(agentd, "model", |table| {
            table.insert("base_url".into(), Value::String(flags.base_url.clone()));
            table.insert("model".into(), Value::String(flags.model.clone()));
            match &flags.key_file {
                Some(file) => {
                    table.insert(
                        "api_key_file".into(),
                        Value::String(file.to_string_lossy().into_owned()),
                    );
                }
                None => {
                    table.remove("api_key_file");
                }
            }
        });
    });
    format!(
        "# written by agentworksctl quickstart on every run: the --config file's settings, then\n\
         # quickstart's own (roots, sockets, listeners, allowed users), then --model-url/--model,\n\
         # then --provider\n{config}"
    )
}

/// Writes `content` to `path`, creating it 0600 (an existing file keeps its mode).
fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(content.as_bytes())
}

/// The folder of the running agentworksctl, where quickstart finds the daemons (and the laptop
/// CLI it offers).
fn binaries_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

fn sibling(binary: &str) -> Result<PathBuf, QuickstartError> {
    let dir = binaries_dir();
    let path = dir.join(binary);
    if path.is_file() {
        Ok(path)
    } else {
        Err(QuickstartError::MissingBinary {
            binary: binary.into(),
            dir,
        })
    }
}

fn start(name: &'static str, state_root: &Path, config: &Path) -> Result<Daemon, QuickstartError> {
    let binary = sibling(name)?;
    let child = Command::new(&binary)
        .env("AGENTWORKS_STATE_ROOT", state_root)
        .env("AGENTWORKS_CONFIG", config)
        .env_remove("AGENTWORKS_DOCUMENTS_ROOT")
        .env_remove("AGENTWORKS_RUNTIME_DIR")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|source| QuickstartError::Spawn {
            binary: binary.display().to_string(),
            source,
        })?;
    Ok(Daemon { name, child })
}

async fn wait_healthy(daemon: &mut Daemon, socket: &Path) -> Result<(), QuickstartError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = daemon.child.try_wait() {
            return Err(QuickstartError::DiedAtStart {
                daemon: daemon.name.into(),
                status,
            });
        }
        let health: Result<Value, _> = UnixClient::new(socket).get("/v1/health").await;
        if health.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(QuickstartError::NotReady {
                daemon: daemon.name.into(),
                seconds: 30,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What [`bootstrap`] made (or found).
struct Demo {
    workflow_id: String,
    code_project_id: String,
    token: DemoToken,
    sign_in_link: String,
}

/// The demo user's `workflows:write` token, as [`demo_token`] settled it.
struct DemoToken {
    token: String,
    id: String,
    reused: bool,
    revoked: Vec<String>,
}

/// The id of a token as agentd prints it, `awt_<16 hex>_<64 hex>`; `None` for anything else.
fn token_id(token: &str) -> Option<&str> {
    let (id, secret) = token.strip_prefix("awt_")?.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 16) && hex(secret, 64)).then_some(id)
}

/// The token to print: the one stored in [`TOKEN_FILE`] while agentd lists it as live (not
/// revoked, not expired, still `workflows:write` alone on every project); otherwise a new one,
/// stored there (0600), and every other live quickstart token of the demo user revoked (an
/// older quickstart made one on every run and kept none).
async fn demo_token(agentd: &UnixClient, state_root: &Path) -> Result<DemoToken, QuickstartError> {
    let fail = |e: ClientError| QuickstartError::Bootstrap(e.to_string());
    let listed: Value = agentd
        .post("/v1/admin/tokens/list", &json!({"user": "demo"}))
        .await
        .map_err(fail)?;
    let now = agentworks_support::clock::now_ms();
    let live_quickstart_tokens: Vec<&Value> = listed
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| {
            t["label"] == TOKEN_LABEL
                && t["revoked_at_ms"].is_null()
                && t["expires_at_ms"].as_i64().is_none_or(|at| at > now)
                && t.get("grant_id").is_none_or(Value::is_null)
        })
        .collect();
    let path = state_root.join(TOKEN_FILE);
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    let stored = stored.trim();
    if let Some(id) = token_id(stored)
        && live_quickstart_tokens.iter().any(|t| {
            t["id"] == id && t["scopes"] == json!(["workflows:write"]) && t["project_id"].is_null()
        })
    {
        return Ok(DemoToken {
            token: stored.to_owned(),
            id: id.to_owned(),
            reused: true,
            revoked: Vec::new(),
        });
    }
    let created: Value = agentd
        .post(
            "/v1/admin/tokens/create",
            &json!({"user": "demo", "scopes": ["workflows:write"], "label": TOKEN_LABEL}),
        )
        .await
        .map_err(fail)?;
    let (Some(token), Some(id)) = (created["token"].as_str(), created["info"]["id"].as_str())
    else {
        return Err(QuickstartError::Bootstrap(
            "agentd returned no token".into(),
        ));
    };
    // Stored before the others are revoked: a run that fails here leaves them as they were.
    crate::deployment::replace_private(&path, token).map_err(|source| {
        QuickstartError::Prepare {
            path: path.clone(),
            source,
        }
    })?;
    let mut revoked = Vec::new();
    for earlier in live_quickstart_tokens {
        let Some(earlier) = earlier["id"].as_str() else {
            continue;
        };
        let _: Value = agentd
            .post("/v1/admin/tokens/revoke", &json!({"id": earlier}))
            .await
            .map_err(fail)?;
        revoked.push(earlier.to_owned());
    }
    Ok(DemoToken {
        token: token.to_owned(),
        id: id.to_owned(),
        reused: false,
        revoked,
    })
}

/// Create (or find) the demo user, workflow and code project and its token ([`demo_token`]),
/// through agentd's socket.
async fn bootstrap(agentd: &UnixClient, state_root: &Path) -> Result<Demo, QuickstartError> {
    let admin = |endpoint: &'static str, body: Value| async move {
        agentd
            .post::<_, Value>(&format!("/v1/admin/{endpoint}"), &body)
            .await
    };
    let exists = |e: &ClientError| e.remote_code() == Some("already_exists");
    let fail = |e: ClientError| QuickstartError::Bootstrap(e.to_string());
    if let Err(e) = admin("users/add", json!({"name": "demo"})).await
        && !exists(&e)
    {
        return Err(fail(e));
    }
    if let Err(e) = admin(
        "projects/add",
        json!({"name": "demo", "kind": "workflow", "owner": "demo", "folder": "demo"}),
    )
    .await
        && !exists(&e)
    {
        return Err(fail(e));
    }
    if let Err(e) = admin(
        "projects/add",
        json!({"name": CODE_PROJECT, "kind": "code", "owner": "demo", "folder": CODE_PROJECT}),
    )
    .await
        && !exists(&e)
    {
        return Err(fail(e));
    }
    let projects = admin("projects/list", json!({})).await.map_err(fail)?;
    let id_of = |name: &str| {
        projects
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .and_then(|p| p["id"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| {
                QuickstartError::Bootstrap(format!(
                    "the project {name:?} is missing after creating it"
                ))
            })
    };
    let (workflow_id, code_project_id) = (id_of("demo")?, id_of(CODE_PROJECT)?);
    let token = demo_token(agentd, state_root).await?;
    // A one-time link that signs the demo user in to the console (15 minutes).
    let link = admin("users/demo/sign-in-links", json!({}))
        .await
        .map_err(fail)?;
    let sign_in_link = link["url"]
        .as_str()
        .ok_or_else(|| QuickstartError::Bootstrap("agentd returned no sign-in link".into()))?
        .to_owned();
    Ok(Demo {
        workflow_id,
        code_project_id,
        token,
        sign_in_link,
    })
}

/// Start everything, call `ready` once all daemons answer and the demo exists, then wait for
/// `shutdown` (or a daemon dying) and stop them all.
pub async fn run(
    state_root: &Path,
    options: &Options,
    shutdown: tokio_util::sync::CancellationToken,
    ready: impl FnOnce(&Started),
) -> Result<(), QuickstartError> {
    // What can be checked without making anything is, so a mistake is reported before any
    // file is written or any daemon starts.
    check_model_url(options.model.as_ref())?;
    let absolute = std::path::absolute(state_root).map_err(|source| QuickstartError::Prepare {
        path: state_root.to_owned(),
        source,
    })?;
    let config_text = configuration(&absolute, options)?;
    check_ports_free(options.ports)?;
    // Then, before anything is created: what quickstart and its daemons create is private
    // (0700 directories, 0600 files), whatever umask we were started with. Process-wide on
    // purpose: agentworksctl quickstart is this process's only job, and the children
    // inherit it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    std::fs::create_dir_all(state_root).map_err(|source| QuickstartError::Prepare {
        path: state_root.to_owned(),
        source,
    })?;
    let state_root = state_root
        .canonicalize()
        .map_err(|source| QuickstartError::Prepare {
            path: state_root.to_owned(),
            source,
        })?;
    // An existing root (an older quickstart's, made under a permissive umask) is tightened.
    ensure_private_dir(&state_root, 0o700)?;
    let ports = options.ports;
    let (documents, config, settings) = prepare(&state_root, &config_text)?;
    let workspaced_socket = state_root.join("run/workspaced.sock");
    let agentd_socket = state_root.join("run/agentd.sock");
    let mut workspaced = start("agentworks-workspaced", &state_root, &config)?;
    wait_healthy(&mut workspaced, &workspaced_socket).await?;
    // Before agentd, which asks it for the providers and to run CLI turns.
    let runnerd_socket = settings.runnerd_socket();
    let mut runnerd = start("agentworks-runnerd", &state_root, &config)?;
    wait_healthy(&mut runnerd, &runnerd_socket).await?;
    let providers = UnixClient::new(&runnerd_socket)
        .get::<ProvidersAnswer>("/v1/providers")
        .await
        .map_err(|e| QuickstartError::Providers(e.to_string()))?
        .providers;
    let mut agentd = start("agentworks-agentd", &state_root, &config)?;
    wait_healthy(&mut agentd, &agentd_socket).await?;
    let gatewayd_socket = state_root.join("run/gatewayd.sock");
    let mut gatewayd = start("agentworks-gatewayd", &state_root, &config)?;
    wait_healthy(&mut gatewayd, &gatewayd_socket).await?;
    let Demo {
        workflow_id,
        code_project_id,
        token,
        sign_in_link,
    } = bootstrap(&UnixClient::new(&agentd_socket), &state_root).await?;
    let api_url = format!("http://127.0.0.1:{}", ports.http);
    // Dropped (the record removed) when this function returns, however it returns.
    let registration = match crate::deployment::Registration::create(&state_root, &api_url) {
        Ok(registration) => Some(registration),
        Err(e) => {
            eprintln!(
                "agentworksctl quickstart: cannot record this quickstart for agentworksctl's other \
                 commands ({e}); they find it with AGENTWORKS_STATE_ROOT={}",
                state_root.display()
            );
            None
        }
    };
    let console_url = format!("{api_url}/console/");
    let mcp_url = format!("{api_url}/mcp");
    let mcp_client_config = json!({
        "mcpServers": {
            "agentworks": {
                "type": "http",
                "url": mcp_url,
                "headers": { "Authorization": format!("Bearer {}", token.token) }
            }
        }
    });
    ready(&Started {
        mcp_url,
        api_url,
        gateway_url: Some(format!("ws://127.0.0.1:{}", ports.gateway)),
        token: token.token,
        token_id: token.id,
        token_reused: token.reused,
        revoked_token_ids: token.revoked,
        workflow_id,
        code_project_id,
        console_url,
        sign_in_link,
        model: settings.agentd.model.as_ref().map(|m| m.model.clone()),
        state_root: state_root.clone(),
        documents_root: documents,
        agentd_socket,
        workspaced_socket,
        runnerd_socket,
        providers,
        mcp_client_config,
        record: registration.as_ref().map(|r| r.path().to_owned()),
    });
    let mut daemons = [gatewayd, agentd, runnerd, workspaced];
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                for daemon in daemons.iter_mut() {
                    if let Ok(Some(status)) = daemon.child.try_wait() {
                        return Err(QuickstartError::Died { daemon: daemon.name.into(), status });
                    }
                }
            }
        }
    }
    // gatewayd first, then agentd (it calls runnerd and workspaced), then runnerd, then
    // workspaced; each waits for its in-flight work.
    drop(daemons);
    Ok(())
}

/// Characters a POSIX shell takes literally in an unquoted word.
fn is_plain_shell_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b)
}

/// `text` as one POSIX shell word: as it is when every character is plain, else in single
/// quotes (each `'` written `'\''`).
fn shell_word(text: &str) -> String {
    if !text.is_empty() && text.bytes().all(is_plain_shell_byte) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// How the banner names `binary` of this build (in `dir`) so that the command works as printed:
/// the bare name when `PATH` (`path_env`) finds this very file, else its absolute path as a
/// shell word (after `cargo build --bins` the binaries are in `target/debug`, which is not on
/// PATH, and another `agentworks` there would be another build). The bare name when this
/// build has no such file.
fn command_name(binary: &str, dir: &Path, path_env: Option<&std::ffi::OsStr>) -> String {
    use std::os::unix::fs::MetadataExt;
    let ours = dir.join(binary);
    let Ok(own) = std::fs::metadata(&ours) else {
        return binary.to_owned();
    };
    let found = path_env
        .into_iter()
        .flat_map(std::env::split_paths)
        .filter(|entry| entry.is_absolute())
        .find_map(|entry| {
            std::fs::metadata(entry.join(binary))
                .ok()
                .filter(|m| m.is_file())
        });
    match found {
        Some(first) if (first.dev(), first.ino()) == (own.dev(), own.ino()) => binary.to_owned(),
        _ => shell_word(&ours.to_string_lossy()),
    }
}

/// The banner's lines on runnerd: that it runs, and its providers, each with its executable or
/// why it is unavailable; with none, how to add one.
fn runnerd_lines(providers: &[ProviderInfo]) -> Vec<String> {
    if providers.is_empty() {
        return vec![
            "  runnerd:         runs, with no provider (coding CLIs as a chat's agent)".into(),
            "                   (add one: restart with --provider codex|claude|opencode=PATH --provider-upstream URL [--provider-key-file FILE], or [runnerd.providers.NAME] in --config)".into(),
        ];
    }
    let unavailable = providers.iter().filter(|p| p.unavailable.is_some()).count();
    let mut lines = vec![format!(
        "  runnerd:         runs, with {}{} (coding CLIs as a chat's agent)",
        match providers.len() {
            1 => "1 provider".to_owned(),
            n => format!("{n} providers"),
        },
        match unavailable {
            0 => String::new(),
            n => format!(", {n} unavailable"),
        }
    )];
    lines.extend(
        providers
            .iter()
            .map(|p| format!("    provider {}", crate::provider_line(p))),
    );
    lines
}

/// The human-readable banner.
pub fn print_human(started: &Started) {
    let dir = binaries_dir();
    let path_env = std::env::var_os("PATH");
    let ctl = command_name("agentworksctl", &dir, path_env.as_deref());
    let cli = command_name("agentworks", &dir, path_env.as_deref());
    println!("agentworks quickstart is running (Ctrl-C stops it)");
    println!("  console:         {}", started.console_url);
    println!(
        "  sign in:         {}   (one-time, for 15 minutes; a new one: {ctl} user sign-in-link demo; a password: {ctl} user passwd demo)",
        started.sign_in_link
    );
    println!("  MCP endpoint:    {}", started.mcp_url);
    println!("  token:           {}", started.token);
    if started.token_reused {
        println!(
            "                   (the same as the last run: still valid, kept in the state root's {TOKEN_FILE}; for a new one: {ctl} token revoke {}, then restart)",
            started.token_id
        );
    } else if started.revoked_token_ids.is_empty() {
        println!(
            "                   (new; kept in the state root's {TOKEN_FILE}: the next run prints it again)"
        );
    } else {
        println!(
            "                   (new; the earlier quickstart token {} revoked; kept in the state root's {TOKEN_FILE}: the next run prints it again)",
            match started.revoked_token_ids.as_slice() {
                [one] => format!("{one} was"),
                many => format!("{} were", many.join(", ")),
            }
        );
    }
    println!("  demo workflow:   {}", started.workflow_id);
    println!(
        "  code project:    {} ({CODE_PROJECT}: chats and laptop folders)",
        started.code_project_id
    );
    match &started.model {
        Some(model) => println!("  model:           {model}"),
        None => println!(
            "  model:           none (turns answer model_not_configured; restart with --model-url URL --model NAME)"
        ),
    }
    for line in runnerd_lines(&started.providers) {
        println!("{line}");
    }
    println!("  state root:      {}", started.state_root.display());
    println!("  documents root:  {}", started.documents_root.display());
    println!();
    println!("MCP client configuration (paste into your client's settings):");
    println!(
        "{}",
        serde_json::to_string_pretty(&started.mcp_client_config).unwrap_or_default()
    );
    println!();
    println!("Try it:");
    println!(
        "  curl -s {} -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/list' -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"_meta\":{{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{{}}}}}}}}'",
        started.mcp_url, started.token
    );
    println!();
    if let Some(gateway) = &started.gateway_url {
        println!("Share a laptop folder with the server-side agent:");
        println!(
            "  {cli} login --server {}          # then open the approval page it prints, signed in to the console",
            started.api_url
        );
        println!("  {cli} executor connect --gateway {gateway} --write-folder ~/src/project");
        println!(
            "  AGENTWORKS_TOKEN={} {cli} chat --server {} --project {CODE_PROJECT} --local project",
            started.token, started.api_url
        );
        println!(
            "  (or install the CLI as ~/.local/bin/agentworks: the one line in the console's Local CLI connection tab, from {}/v1/cli)",
            started.api_url
        );
        println!();
    }
    match &started.record {
        Some(_) => println!(
            "Administer it from another shell: {ctl} status (it finds this quickstart while it runs, unless a system install is there), or AGENTWORKS_STATE_ROOT={} {ctl} status",
            shell_word(&started.state_root.to_string_lossy())
        ),
        None => println!(
            "Administer it from another shell: AGENTWORKS_STATE_ROOT={} {ctl} status",
            shell_word(&started.state_root.to_string_lossy())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_port_defaults_to_the_next_and_can_be_given() {
        assert_eq!(
            Ports::new(8470, None).ok(),
            Some(Ports {
                http: 8470,
                gateway: 8471
            })
        );
        assert_eq!(
            Ports::new(8470, Some(9000)).ok(),
            Some(Ports {
                http: 8470,
                gateway: 9000
            })
        );
        assert!(Ports::new(65535, None).is_err());
        assert!(Ports::new(8470, Some(8470)).is_err());
    }

    fn merged(user: &str, model: Option<&ModelFlags>) -> toml::Table {
        let ports = Ports::new(9100, None).unwrap();
        let user = (!user.is_empty()).then(|| user.parse::<toml::Table>().unwrap());
        config_text(ports, user, model, &[], None).parse().unwrap()
    }

    #[test]
    fn the_config_file_is_merged_under_quickstarts_own_settings() {
        let config = merged(
            "state_root = \"/var/lib/agentworks\"\nruntime_dir = \"/run/agentworks\"\n\
             [agentd]\nlisten = \"0.0.0.0:80\"\nsocket = \"/run/x.sock\"\nmax_connections = 7\n\
             [agentd.model]\nbase_url = \"https://api.example.com/v1\"\nmodel = \"m1\"\nmax_tool_rounds = 3\n\
             [gatewayd]\nallowed_users = [\"agentworks\"]\nheartbeat_secs = 5\n\
             [workspaced]\nmax_file_bytes = 1024\n",
            None,
        );
        // Kept: everything that is not quickstart's.
        assert_eq!(config["agentd"]["max_connections"].as_integer(), Some(7));
        assert_eq!(config["agentd"]["model"]["model"].as_str(), Some("m1"));
        assert_eq!(
            config["agentd"]["model"]["max_tool_rounds"].as_integer(),
            Some(3)
        );
        assert_eq!(config["gatewayd"]["heartbeat_secs"].as_integer(), Some(5));
        assert_eq!(
            config["workspaced"]["max_file_bytes"].as_integer(),
            Some(1024)
        );
        // quickstart's win.
        assert_eq!(config["agentd"]["listen"].as_str(), Some("127.0.0.1:9100"));
        assert_eq!(
            config["gatewayd"]["listen"].as_str(),
            Some("127.0.0.1:9101")
        );
        assert!(
            config["gatewayd"]["allowed_users"]
                .as_array()
                .unwrap()
                .is_empty()
        );
        for (section, key) in [
            ("", "state_root"),
            ("", "runtime_dir"),
            ("agentd", "socket"),
        ] {
            let table = if section.is_empty() {
                &config
            } else {
                config[section].as_table().unwrap()
            };
            assert!(!table.contains_key(key), "{section}.{key}");
        }
    }

    #[test]
    fn agentd_offers_the_build_folders_cli_unless_the_config_file_names_a_folder() {
        let ports = Ports::new(9100, None).unwrap();
        let dir = Path::new("/src/agentworks/target/debug");
        let config: toml::Table = config_text(ports, None, None, &[], Some(dir))
            .parse()
            .unwrap();
        assert_eq!(
            config["agentd"]["cli_dir"].as_str(),
            Some("/src/agentworks/target/debug")
        );
        let user = "[agentd]\ncli_dir = \"/opt/cli\"\n"
            .parse::<toml::Table>()
            .unwrap();
        let config: toml::Table = config_text(ports, Some(user), None, &[], Some(dir))
            .parse()
            .unwrap();
        assert_eq!(config["agentd"]["cli_dir"].as_str(), Some("/opt/cli"));
        let config: toml::Table = config_text(ports, None, None, &[], None).parse().unwrap();
        assert!(config["agentd"].get("cli_dir").is_none());

        let build = tempfile::tempdir().unwrap();
        assert_eq!(offered_cli_dir(build.path()), None, "no agentworks built");
        std::fs::write(build.path().join("agentworks"), "").unwrap();
        assert_eq!(offered_cli_dir(build.path()).as_deref(), Some(build.path()));
    }

    #[test]
    fn the_banner_names_a_binary_by_its_path_unless_path_finds_that_very_file() {
        let root = tempfile::tempdir().unwrap();
        let build = root.path().join("my build/target/debug");
        let other = root.path().join("bin");
        std::fs::create_dir_all(&build).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(build.join("agentworksctl"), "ours").unwrap();
        std::fs::write(other.join("agentworksctl"), "another build").unwrap();
        let ours = build.join("agentworksctl").to_string_lossy().into_owned();
        let quoted = format!("'{ours}'");
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        for (path_env, expected) in [
            (None, quoted.as_str()),
            (Some(path(&[])), quoted.as_str()),
            (Some(path(&[&build])), "agentworksctl"),
            (Some(path(&[&other, &build])), quoted.as_str()),
            (Some(path(&[&build, &other])), "agentworksctl"),
            // A relative entry is where the person happens to be: never relied on.
            (Some("target/debug".into()), quoted.as_str()),
        ] {
            assert_eq!(
                command_name("agentworksctl", &build, path_env.as_deref()),
                expected,
                "{path_env:?}"
            );
        }
        // Not built: the bare name is all there is to say.
        assert_eq!(
            command_name("agentworks", &build, Some(&path(&[&build]))),
            "agentworks"
        );
        assert_eq!(shell_word("/plain/path-1.2"), "/plain/path-1.2");
        assert_eq!(shell_word("/it's here"), "'/it'\\''s here'");
    }

    #[test]
    fn the_model_flags_win_over_the_files_model() {
        let flags = ModelFlags {
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "flagged".into(),
            key_file: None,
        };
        let config = merged(
            "[agentd.model]\nbase_url = \"https://a/v1\"\nmodel = \"m1\"\napi_key_file = \"/k\"\nmax_tool_rounds = 3\n",
            Some(&flags),
        );
        let model = &config["agentd"]["model"];
        assert_eq!(model["base_url"].as_str(), Some("http://127.0.0.1:9/v1"));
        assert_eq!(model["model"].as_str(), Some("flagged"));
        assert!(
            model.get("api_key_file").is_none(),
            "the file's key is not the flags' model's"
        );
        assert_eq!(model["max_tool_rounds"].as_integer(), Some(3));
        let config = merged(
            "",
            Some(&ModelFlags {
                key_file: Some("/k2".into()),
                ..flags
            }),
        );
        assert_eq!(
            config["agentd"]["model"]["api_key_file"].as_str(),
            Some("/k2")
        );
        assert!(merged("", None)["agentd"].get("model").is_none());
    }

    #[test]
    fn a_key_file_must_be_a_readable_non_empty_file() {
        // A private directory of this test (no tempfile dependency in this crate for one test).
        let dir = std::env::temp_dir().join(format!("aw-qs-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, "sk-secret-123\n").unwrap();
        assert_eq!(
            check_key_file(&key, "--model-key-file").unwrap(),
            key.canonicalize().unwrap()
        );
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n \n").unwrap();
        for (bad, why) in [
            (dir.join("absent"), "cannot be opened"),
            (empty, "is empty"),
            (dir.clone(), "not a regular file"),
        ] {
            let error = check_key_file(&bad, "--model-key-file").unwrap_err();
            assert!(error.is_usage());
            let text = error.to_string();
            assert!(
                text.contains(why) && text.contains("--model-key-file"),
                "{text}"
            );
            assert!(!text.contains("sk-secret"), "{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    fn provider_flags(providers: &[&str]) -> ProviderFlags {
        ProviderFlags {
            providers: providers.iter().map(|p| (*p).to_owned()).collect(),
            upstream: "http://127.0.0.1:9/v1".into(),
            key_file: None,
            model: None,
        }
    }

    #[test]
    fn quickstart_names_every_driver_and_every_acp_agent_runnerd_has() {
        use agentworks_daemon::config::{ACP_AGENTS, PROVIDER_DRIVERS};
        for driver in PROVIDER_DRIVERS.iter().filter(|d| **d != "acp") {
            assert!(
                QUICKSTART_PROVIDERS
                    .iter()
                    .any(|(name, d, acp)| name == driver && d == driver && acp.is_none()),
                "{driver}"
            );
        }
        for (agent, apis) in ACP_AGENTS {
            let (_, driver, acp) = QUICKSTART_PROVIDERS
                .iter()
                .find(|(name, ..)| name == agent)
                .unwrap_or_else(|| panic!("{agent}"));
            assert_eq!(*driver, "acp");
            let acp = acp.unwrap();
            assert_eq!(acp.agent, *agent);
            assert!(apis.contains(&acp.api), "{agent}: {}", acp.api);
        }
        for (_, driver, _) in QUICKSTART_PROVIDERS {
            assert!(PROVIDER_DRIVERS.contains(driver), "{driver}");
        }
    }

    #[test]
    fn provider_flags_name_a_driver_and_an_executable() {
        let checked = checked_providers(&provider_flags(&["codex=/opt/codex/bin/codex"])).unwrap();
        assert_eq!(
            checked,
            [ProviderTable {
                name: "codex".into(),
                driver: "codex",
                acp: None,
                executable: "/opt/codex/bin/codex".into(),
                model: DEFAULT_PROVIDER_MODEL.into(),
                upstream: "http://127.0.0.1:9/v1".into(),
                key_file: None,
            }]
        );
        let claude = checked_providers(&provider_flags(&["claude=/opt/bin/claude"])).unwrap();
        assert_eq!(
            (claude[0].name.as_str(), claude[0].driver),
            ("claude", "claude")
        );
        // OpenCode is the ACP driver with its [acp] table.
        let opencode = checked_providers(&provider_flags(&["opencode=/opt/bin/opencode"])).unwrap();
        assert_eq!(
            (opencode[0].name.as_str(), opencode[0].driver),
            ("opencode", "acp")
        );
        assert_eq!(
            opencode[0].acp,
            Some(AcpTable {
                agent: "opencode",
                args: &["acp"],
                api: "chat_completions"
            })
        );
        // A bare name stays one (runnerd looks it up on its PATH); a relative path is made
        // absolute here, where it means something.
        let bare = checked_providers(&provider_flags(&["codex=codex"])).unwrap();
        assert_eq!(bare[0].executable, "codex");
        let relative = checked_providers(&provider_flags(&["codex=bin/codex"])).unwrap();
        assert_eq!(
            Path::new(&relative[0].executable),
            std::env::current_dir().unwrap().join("bin/codex")
        );
        let modelled = checked_providers(&ProviderFlags {
            model: Some("o9".into()),
            ..provider_flags(&["codex=codex"])
        })
        .unwrap();
        assert_eq!(modelled[0].model, "o9");

        for (given, says) in [
            ("codex", "NAME=PATH"),
            ("gemini=/usr/bin/gemini", "runnerd has no driver \"gemini\""),
            (
                "gemini=/usr/bin/gemini",
                "and runnerd has: codex, claude, opencode",
            ),
            // `acp` is a dialect, not an agent: which agent would it configure?
            ("acp=/usr/bin/opencode", "runnerd has no driver \"acp\""),
            ("codex=", "the executable is empty"),
        ] {
            let error = checked_providers(&provider_flags(&[given])).unwrap_err();
            assert!(error.is_usage());
            let text = error.to_string();
            assert!(text.contains(says) && text.contains(given), "{text}");
        }
        let twice = checked_providers(&provider_flags(&["codex=a", "codex=b"])).unwrap_err();
        assert!(twice.to_string().contains("given twice"), "{twice}");
        let far = checked_providers(&ProviderFlags {
            upstream: "http://example.com/v1".into(),
            ..provider_flags(&["codex=codex"])
        })
        .unwrap_err();
        assert!(far.is_usage());
        assert!(
            far.to_string().contains("--provider-upstream") && far.to_string().contains("https://"),
            "{far}"
        );
    }

    #[test]
    fn a_provider_flag_replaces_the_files_provider_of_its_name_only() {
        let ports = Ports::new(9100, None).unwrap();
        let user = "[runnerd]\nsocket = \"/run/x.sock\"\nallowed_users = [\"agentworks\"]\nturn_timeout_secs = 60\n\
                    [runnerd.providers.codex]\ndriver = \"codex\"\nexecutable = \"/old\"\nmodel = \"m\"\n\
                    upstream = \"https://a/v1\"\nkey_file = \"/k\"\n\
                    [runnerd.providers.other]\ndriver = \"codex\"\nexecutable = \"codex\"\nmodel = \"m2\"\n\
                    upstream = \"https://b/v1\"\n"
            .parse::<toml::Table>()
            .unwrap();
        let flags = checked_providers(&provider_flags(&["codex=/new/codex"])).unwrap();
        let config: toml::Table = config_text(ports, Some(user), None, &flags, None)
            .parse()
            .unwrap();
        let runnerd = &config["runnerd"];
        assert!(runnerd.get("socket").is_none());
        assert!(runnerd["allowed_users"].as_array().unwrap().is_empty());
        assert_eq!(runnerd["turn_timeout_secs"].as_integer(), Some(60));
        let codex = &runnerd["providers"]["codex"];
        assert_eq!(codex["executable"].as_str(), Some("/new/codex"));
        assert_eq!(codex["model"].as_str(), Some(DEFAULT_PROVIDER_MODEL));
        assert_eq!(codex["upstream"].as_str(), Some("http://127.0.0.1:9/v1"));
        assert!(
            codex.get("key_file").is_none(),
            "the file's key is not the flags'"
        );
        assert_eq!(
            runnerd["providers"]["other"]["upstream"].as_str(),
            Some("https://b/v1")
        );
        // No flags, no file: runnerd runs with no provider, and only the current user calls it.
        let config: toml::Table = config_text(ports, None, None, &[], None).parse().unwrap();
        assert!(config["runnerd"].get("providers").is_none());
        assert!(
            config["runnerd"]["allowed_users"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_opencode_provider_is_written_with_its_acp_table_and_the_daemons_read_it() {
        let ports = Ports::new(9100, None).unwrap();
        let flags = checked_providers(&provider_flags(&[
            "opencode=/opt/oc/bin/opencode",
            "codex=codex",
        ]))
        .unwrap();
        let text = config_text(ports, None, None, &flags, None);
        let config: toml::Table = text.parse().unwrap();
        let opencode = &config["runnerd"]["providers"]["opencode"];
        assert_eq!(opencode["driver"].as_str(), Some("acp"));
        assert_eq!(
            opencode["executable"].as_str(),
            Some("/opt/oc/bin/opencode")
        );
        let acp = &opencode["acp"];
        assert_eq!(acp["agent"].as_str(), Some("opencode"));
        assert_eq!(acp["args"].as_array().unwrap(), &[toml::Value::from("acp")]);
        assert_eq!(acp["api"].as_str(), Some("chat_completions"));
        assert!(config["runnerd"]["providers"]["codex"].get("acp").is_none());
        // As the daemons read it: valid, the [acp] table where the ACP driver needs it.
        let dir = std::env::temp_dir().join(format!("aw-qs-acp-{}", std::process::id()));
        let read = Config::from_text(&text, &dir.join("agentworks.toml"), &|_| None).unwrap();
        let provider = &read.runnerd.providers["opencode"];
        assert_eq!(provider.driver, "acp");
        assert_eq!(
            provider
                .acp
                .as_ref()
                .map(|a| (a.agent.as_str(), a.args.clone())),
            Some(("opencode", vec!["acp".to_owned()]))
        );
    }

    #[test]
    fn the_banner_lists_runnerds_providers_and_says_how_to_add_one() {
        let none = runnerd_lines(&[]).join("\n");
        assert!(
            none.contains("runnerd:")
                && none.contains("no provider")
                && none.contains("--provider codex|claude|opencode=PATH"),
            "{none}"
        );
        let providers = [
            ProviderInfo {
                name: "codex".into(),
                driver: "codex".into(),
                model: "gpt-5.5".into(),
                executable: Some("/usr/local/bin/codex".into()),
                unavailable: None,
            },
            ProviderInfo {
                name: "spare".into(),
                driver: "codex".into(),
                model: "m".into(),
                executable: None,
                unavailable: Some("/gone/codex does not exist".into()),
            },
        ];
        let lines = runnerd_lines(&providers);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("2 providers, 1 unavailable"), "{lines:?}");
        assert!(
            lines[1].contains("codex (driver codex, model gpt-5.5): /usr/local/bin/codex"),
            "{lines:?}"
        );
        assert!(
            lines[2].contains("spare")
                && lines[2].contains("UNAVAILABLE, /gone/codex does not exist"),
            "{lines:?}"
        );
    }
}
