//! The one agentworks configuration file: `/etc/agentworks/agentworks.toml`, one section per
//! daemon.
//!
//! Owns finding the file (flag, then `AGENTWORKS_CONFIG`, then the default path), parsing it
//! strictly (unknown keys are refused so a typo never silently becomes a default), applying the
//! environment overrides and validating the result into one [`Config`].
//!
//! Must never create directories, open sockets or touch the state root: it only describes where
//! things are. Every section (`[workspaced]`, `[agentd]`, `[gatewayd]`, `[cluster]`) is typed
//! and checked here, so a daemon never starts on a value another one would refuse. The only
//! things it reads besides the file are the host name (the default `cluster.host_id`) and, in
//! [`Config::load`], the metadata of the NATS credentials file (refused when group- or
//! world-readable).

use std::path::{Path, PathBuf};

use super::layout::StateLayout;

pub mod cluster_urls;

/// Where the configuration is read from when neither `--config` nor `AGENTWORKS_CONFIG` names
/// a file. A missing file at this path means "all defaults".
pub const DEFAULT_CONFIG_PATH: &str = "/etc/agentworks/agentworks.toml";

/// Environment variable naming the config file (beaten by an explicit `--config`).
pub const ENV_CONFIG: &str = "AGENTWORKS_CONFIG";
/// Environment variable overriding `state_root` (beats the file).
pub const ENV_STATE_ROOT: &str = "AGENTWORKS_STATE_ROOT";
/// Environment variable overriding `documents_root` (beats the file).
pub const ENV_DOCUMENTS_ROOT: &str = "AGENTWORKS_DOCUMENTS_ROOT";
/// Environment variable overriding `runtime_dir` (beats the file).
pub const ENV_RUNTIME_DIR: &str = "AGENTWORKS_RUNTIME_DIR";

/// The longest `gatewayd.heartbeat_secs`: the longest heartbeat the laptop follows.
const MAX_HEARTBEAT_SECS: u64 = 600;
/// The longest `gatewayd.token_recheck_ms`: an hour.
const MAX_TOKEN_RECHECK_MS: u64 = 3_600_000;

const DEFAULT_STATE_ROOT: &str = "/var/lib/agentworks";
const DEFAULT_DOCUMENTS_ROOT: &str = "/var/lib/agentworks-documents";
const DEFAULT_RUNTIME_DIR: &str = "/run/agentworks";
/// Where the packages install the laptop CLI that agentd serves (`[agentd] cli_dir`).
pub const DEFAULT_CLI_DIR: &str = "/usr/lib/agentworks/cli";

/// The validated configuration of every daemon.
///
/// Defaults, in order of precedence for the three roots:
///
/// - `state_root`: `AGENTWORKS_STATE_ROOT`, else the file, else `/var/lib/agentworks`.
/// - `runtime_dir`: `AGENTWORKS_RUNTIME_DIR`, else the file, else `<state_root>/run` **when
///   `AGENTWORKS_STATE_ROOT` is set**, else `/run/agentworks`. A private state root (tests,
///   `quickstart`, a second instance) therefore gets private sockets instead of silently
///   talking to the system daemons.
/// - `documents_root`: `AGENTWORKS_DOCUMENTS_ROOT`, else the file, else `<state_root>/documents`
///   when `AGENTWORKS_STATE_ROOT` is set, else `/var/lib/agentworks-documents`.
///
/// An environment variable that is set but empty counts as unset.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The shared state root, one per host, where each daemon keeps its own subtree.
    pub state_root: PathBuf,
    /// The default documents root: one folder per project.
    pub documents_root: PathBuf,
    /// Where the daemons' sockets live.
    pub runtime_dir: PathBuf,
    /// The `[workspaced]` section.
    pub workspaced: WorkspacedConfig,
    /// The `[agentd]` section.
    pub agentd: AgentdConfig,
    /// The `[gatewayd]` section.
    pub gatewayd: GatewaydConfig,
    /// The `[runnerd]` section: coding CLIs as a chat's agent.
    pub runnerd: RunnerdConfig,
    /// The `[cluster]` section: absent (or empty) means one host on embedded SQLite.
    pub cluster: ClusterConfig,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            state_root: PathBuf::from(DEFAULT_STATE_ROOT),
            documents_root: PathBuf::from(DEFAULT_DOCUMENTS_ROOT),
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            workspaced: WorkspacedConfig::default(),
            agentd: AgentdConfig::default(),
            gatewayd: GatewaydConfig::default(),
            runnerd: RunnerdConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// The `[workspaced]` section.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkspacedConfig {
    /// The socket path; `None` means `<runtime_dir>/workspaced.sock`
    /// (see [`Config::workspaced_socket`]).
    pub socket: Option<PathBuf>,
    /// Users (besides root and workspaced's own uid) whose processes may call the socket.
    pub allowed_users: Vec<String>,
    /// Content bigger than this many bytes is refused.
    pub max_file_bytes: u64,
    /// How long a write waits for the per-project lock, in milliseconds.
    pub lock_timeout_ms: u64,
    /// The most results a search returns.
    pub search_max_results: usize,
    /// With `[cluster]`: also serve this workspaced's API to agentd hosts over NATS, on
    /// `agentworks.workspaced.<host_id>.call` (documents on a host that runs no agentd).
    pub serve_cluster: bool,
}

impl Default for WorkspacedConfig {
    fn default() -> WorkspacedConfig {
        WorkspacedConfig {
            socket: None,
            allowed_users: vec!["agentworks".to_owned()],
            max_file_bytes: 8 * 1024 * 1024,
            lock_timeout_ms: 30_000,
            search_max_results: 200,
            serve_cluster: false,
        }
    }
}

/// The `[agentd]` section.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentdConfig {
    /// The public HTTP listener (MCP at `/mcp`, the REST API at `/v1/`).
    pub listen: std::net::SocketAddr,
    /// The URL clients use to reach `listen` (behind a proxy it differs); `None`: `http://<listen>`.
    pub public_url: Option<String>,
    /// The operator and gateway socket; `None` means `<runtime_dir>/agentd.sock`.
    pub socket: Option<PathBuf>,
    /// Browser origins allowed to call the public endpoints besides `public_url` itself.
    pub allowed_origins: Vec<String>,
    /// The group whose members may use the operator endpoints (root always may).
    pub admin_group: String,
    /// Users whose processes may use the gateway endpoints (token checks, revocations).
    pub gateway_users: Vec<String>,
    /// Connections the public listener holds at once; a quarter is kept for authenticated
    /// requests.
    pub max_connections: usize,
    /// Connections the public listener holds at once from one client address.
    pub max_connections_per_address: usize,
    /// Bytes of request bodies the public listener holds at once (read or being handled); a
    /// request waits for its share (then 503) and no single body may be larger.
    pub max_body_bytes_in_flight: usize,
    /// Handshake-era (2025) MCP sessions one token may hold; one more ends its least recently
    /// used.
    pub max_sessions_per_token: usize,
    /// PEM files (absolute paths, each holding one or more certificates) of root CAs agentd's
    /// outbound requests trust besides the public web roots, e.g. an internal CA serving OAuth
    /// client metadata documents. A file agentd cannot read or parse is logged and metadata
    /// documents are then not fetched at all.
    pub outbound_root_certificates: Vec<PathBuf>,
    /// The folder of the laptop CLI binaries agentd offers at `/v1/cli`, by fixed names
    /// (`agentworks-linux-x86_64`, `agentworks-linux-aarch64`; in a cargo build folder also
    /// `agentworks`, for agentd's own architecture). Absolute. The packages install the CLI
    /// built with the daemons at [`DEFAULT_CLI_DIR`].
    pub cli_dir: PathBuf,
    /// The `[agentd.model]` sub-table: the chat model. `None`: chats work, turns are refused.
    pub model: Option<ModelConfig>,
    /// With `[cluster]`: reach the workspaced of cluster host `workspaced_host` over NATS
    /// instead of `workspaced.sock`. `None`: the socket on this host.
    pub workspaced_host: Option<String>,
    /// The `[agentd.project_workspaced_hosts]` table, with `[cluster]`: a project's folder →
    /// the cluster host whose workspaced holds it, reached over NATS. A project not listed
    /// goes where `workspaced_host` says.
    pub project_workspaced_hosts: std::collections::BTreeMap<String, String>,
}

/// The `[agentd.model]` sub-table: an OpenAI-compatible chat-completions endpoint.
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The API base, e.g. `https://api.example.com/v1` (`/chat/completions` is appended).
    /// `http://` is accepted for loopback hosts only. Required: validation refuses it missing
    /// (a default here, so that a file whose model comes from elsewhere, such as quickstart's
    /// `--model-url`, still parses).
    #[serde(default)]
    pub base_url: String,
    /// The model name sent with every request; required, as `base_url` is.
    #[serde(default)]
    pub model: String,
    /// A file holding the API key; else `$CREDENTIALS_DIRECTORY/model-api-key` (a systemd
    /// credential) if present; else no key is sent.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Most model requests with tool calls in one turn.
    #[serde(default = "default_max_tool_rounds")]
    pub max_tool_rounds: u32,
    /// How long one model request may take, in seconds.
    #[serde(default = "default_request_timeout_secs")]
    pub request_timeout_secs: u64,
    /// Most bytes (as JSON) of earlier chat messages sent with a request: older turns are left
    /// out whole; the current turn is always sent.
    #[serde(default = "default_max_history_bytes")]
    pub max_history_bytes: usize,
    /// Stream answers (`stream: true`), so the console shows the text as it arrives; `false`
    /// for an endpoint that refuses streaming.
    #[serde(default = "default_stream")]
    pub stream: bool,
}

fn default_stream() -> bool {
    true
}

fn default_max_tool_rounds() -> u32 {
    16
}

fn default_request_timeout_secs() -> u64 {
    300
}

fn default_max_history_bytes() -> usize {
    256 * 1024
}

impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the key's path, never the key.
        f.debug_struct("ModelConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key_file", &self.api_key_file)
            .field("max_tool_rounds", &self.max_tool_rounds)
            .field("request_timeout_secs", &self.request_timeout_secs)
            .field("max_history_bytes", &self.max_history_bytes)
            .field("stream", &self.stream)
            .finish()
    }
}

impl Default for AgentdConfig {
    fn default() -> AgentdConfig {
        AgentdConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 8470)),
            public_url: None,
            socket: None,
            allowed_origins: Vec::new(),
            admin_group: "agentworks-admin".to_owned(),
            gateway_users: vec!["agentworks-gw".to_owned()],
            max_connections: 1024,
            max_connections_per_address: 64,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            max_sessions_per_token: 32,
            outbound_root_certificates: Vec::new(),
            cli_dir: PathBuf::from(DEFAULT_CLI_DIR),
            model: None,
            workspaced_host: None,
            project_workspaced_hosts: std::collections::BTreeMap::new(),
        }
    }
}

impl AgentdConfig {
    /// `public_url`, else `http://<listen>`, without a trailing slash.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("http://{}", self.listen),
        }
    }
}

/// The `[gatewayd]` section.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewaydConfig {
    /// The public WebSocket listener laptops dial (`/v1/executor`).
    pub listen: std::net::SocketAddr,
    /// The URL laptops use (`wss://…` behind a TLS proxy); `None`: `ws://<listen>`.
    pub public_url: Option<String>,
    /// The dispatch socket agentd calls; `None` means `<runtime_dir>/gatewayd.sock`.
    pub socket: Option<PathBuf>,
    /// Peers (besides root and gatewayd's own user) that may dispatch: agentd's user.
    pub allowed_users: Vec<String>,
    /// How often the gateway pings each executor, in seconds.
    pub heartbeat_secs: u64,
    /// How often connected tokens are re-checked with agentd, in milliseconds.
    pub token_recheck_ms: u64,
    /// Most executor connections held at once.
    pub max_connections: usize,
    /// Most executor connections held at once from one client address.
    pub max_connections_per_address: usize,
    /// The gateways of this deployment (`wss://host:port`; `ws://` to loopback only), sent to
    /// every executor in its welcome so laptops fail over between all of them. Empty: none.
    pub advertised_urls: Vec<String>,
}

impl Default for GatewaydConfig {
    fn default() -> GatewaydConfig {
        GatewaydConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 8471)),
            public_url: None,
            socket: None,
            allowed_users: vec!["agentworks".to_owned()],
            heartbeat_secs: 15,
            token_recheck_ms: 250,
            max_connections: 10_000,
            max_connections_per_address: 64,
            advertised_urls: Vec::new(),
        }
    }
}

impl GatewaydConfig {
    /// `public_url`, else `ws://<listen>`, without a trailing slash.
    pub fn public_url(&self) -> String {
        match &self.public_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("ws://{}", self.listen),
        }
    }
}

/// The `[runnerd]` section: the coding CLIs runnerd may run as a chat's agent, and its limits.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerdConfig {
    /// The socket agentd calls; `None` means `<runtime_dir>/runnerd.sock`.
    pub socket: Option<PathBuf>,
    /// Peers (besides root and runnerd's own user) that may run turns: agentd's user.
    pub allowed_users: Vec<String>,
    /// The longest a turn may run, in seconds (then it ends with `turn_timeout`).
    pub turn_timeout_secs: u64,
    /// The most processes a turn's CLI and its commands may have at once.
    pub max_processes: u64,
    /// The most memory a turn may use, in MiB, where runnerd's cgroup is delegated to it;
    /// `None`: half of the machine's memory.
    pub max_memory_mib: Option<u64>,
    /// The providers, by name (`[runnerd.providers.NAME]`).
    pub providers: std::collections::BTreeMap<String, ProviderConfig>,
    /// With `[cluster]`: also serve runnerd to agentd hosts over NATS, on
    /// `agentworks.runnerd.<host_id>.call` (the host that stores a project runs its CLIs;
    /// agentd finds it as it finds that project's workspaced).
    pub serve_cluster: bool,
}

impl Default for RunnerdConfig {
    fn default() -> RunnerdConfig {
        RunnerdConfig {
            socket: None,
            allowed_users: vec!["agentworks".to_owned()],
            turn_timeout_secs: 30 * 60,
            max_processes: 512,
            max_memory_mib: None,
            providers: std::collections::BTreeMap::new(),
            serve_cluster: false,
        }
    }
}

/// The drivers runnerd has: the CLI dialects it can run.
pub const PROVIDER_DRIVERS: &[&str] = &["codex", "claude", "acp"];

/// The ACP agents runnerd knows how to give the model gateway to (`acp.agent`), each with the
/// APIs it can speak to the gateway (`acp.api`), its default first.
pub const ACP_AGENTS: &[(&str, &[&str])] = &[("opencode", &["chat_completions"])];

/// One `[runnerd.providers.NAME]` table: a coding CLI and the model it uses.
///
/// A Codex provider:
///
/// ```toml
/// [runnerd.providers.codex]
/// driver = "codex"
/// executable = "codex"
/// model = "gpt-5.1-codex"
/// upstream = "https://api.openai.com/v1"
/// key_file = "/etc/agentworks/openai.key"
/// ```
///
/// An agent that speaks the Agent Client Protocol (OpenCode), with its `acp` table:
///
/// ```toml
/// [runnerd.providers.opencode]
/// driver = "acp"
/// executable = "opencode"
/// model = "gpt-4.1"
/// upstream = "https://api.openai.com/v1"
/// key_file = "/etc/agentworks/openai.key"
///
/// [runnerd.providers.opencode.acp]
/// agent = "opencode"          # how the gateway is given to it: a generated opencode.json
/// args = ["acp"]              # what makes the executable speak ACP on stdio
/// api = "chat_completions"    # what it speaks to the gateway (the agent's default if left out)
/// ```
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The CLI's dialect: `codex`, `claude` (Claude Code), or `acp` for any agent speaking the
    /// Agent Client Protocol.
    pub driver: String,
    /// The CLI's executable: an absolute path, or a name looked up on runnerd's `PATH` at start.
    pub executable: String,
    /// The model name the CLI asks for.
    pub model: String,
    /// The upstream API's base URL (`https://…/v1`; `http://` to loopback only). runnerd's
    /// model gateway forwards the CLI's requests there.
    pub upstream: String,
    /// The file holding the upstream's API key (an absolute path, read by runnerd only).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// `driver = "acp"` only, and then required: how the agent is run.
    #[serde(default)]
    pub acp: Option<AcpProviderConfig>,
}

/// `[runnerd.providers.NAME.acp]`: how an ACP agent is run and given the model gateway.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcpProviderConfig {
    /// Which agent it is, so runnerd knows how to give it the gateway: `opencode` (a generated
    /// `opencode.json` naming an OpenAI-compatible provider at the gateway). One of
    /// [`ACP_AGENTS`].
    pub agent: String,
    /// The arguments after the executable that make it speak ACP on its stdin and stdout
    /// (`["acp"]` for OpenCode, `["--acp"]` for Gemini CLI).
    #[serde(default)]
    pub args: Vec<String>,
    /// The API it speaks to the gateway: `chat_completions`; the agent's default when left out.
    #[serde(default)]
    pub api: Option<String>,
}

/// The `[cluster]` section, shared by agentd and gatewayd (issue 16): several hosts sharing
/// PostgreSQL (the rows are the truth) and NATS (messages wake and route). Either both URLs
/// are set or neither; neither means today's single host on embedded SQLite.
#[derive(Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The shared PostgreSQL database, `postgres://user[:password]@host[:port]/database`.
    pub database_url: Option<String>,
    /// The NATS server, `tls://host:port` (`nats://` only to this machine's loopback).
    pub nats_url: Option<String>,
    /// A NATS credentials file (JWT and NKey seed) for this daemon's NATS user: an absolute
    /// path, readable by its owner only.
    pub nats_credentials: Option<PathBuf>,
    /// The CA certificate (PEM) that signs the NATS server's certificate, trusted instead of
    /// the system's CAs; absolute. Setting it requires TLS.
    pub nats_ca_file: Option<PathBuf>,
    /// This host's name in the cluster: leases and routing subjects name it. ASCII letters,
    /// digits, `-` and `_`, at most [`MAX_HOST_ID_LEN`]; defaults to the host name (after
    /// loading, always set when a cluster is configured).
    pub host_id: Option<String>,
}

/// The longest `cluster.host_id`.
pub const MAX_HOST_ID_LEN: usize = 63;

impl ClusterConfig {
    /// True when this host is one of several (both URLs set; validation refuses one alone).
    pub fn is_enabled(&self) -> bool {
        self.database_url.is_some() && self.nats_url.is_some()
    }
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A database URL may carry a password: never print it.
        f.debug_struct("ClusterConfig")
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact_url),
            )
            .field("nats_url", &self.nats_url.as_deref().map(redact_url))
            .field("nats_credentials", &self.nats_credentials)
            .field("nats_ca_file", &self.nats_ca_file)
            .field("host_id", &self.host_id)
            .finish()
    }
}

/// What is wrong with a provider's `acp` table for its driver, if anything: required with
/// `driver = "acp"` and refused with any other, a known agent, an API that agent speaks, and
/// arguments without NUL bytes.
fn acp_problem(driver: &str, acp: Option<&AcpProviderConfig>) -> Option<String> {
    let agents = || {
        ACP_AGENTS
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let acp = match (driver, acp) {
        ("acp", Some(acp)) => acp,
        ("acp", None) => {
            return Some(format!(
                "driver \"acp\" needs an [acp] table naming the agent (one of: {}) and the \
                 arguments that make it speak ACP, e.g. agent = \"opencode\", args = [\"acp\"]",
                agents()
            ));
        }
        (_, Some(_)) => {
            return Some(format!(
                "an [acp] table is only for driver \"acp\", not {driver:?}"
            ));
        }
        (_, None) => return None,
    };
    let Some((_, apis)) = ACP_AGENTS.iter().find(|(name, _)| *name == acp.agent) else {
        return Some(format!(
            "acp.agent {:?} is not one runnerd knows how to give the model gateway to (it knows: {})",
            acp.agent,
            agents()
        ));
    };
    if let Some(api) = &acp.api
        && !apis.contains(&api.as_str())
    {
        return Some(format!(
            "acp.api {api:?} is not one {} speaks to the gateway (it speaks: {})",
            acp.agent,
            apis.join(", ")
        ));
    }
    if acp.args.iter().any(|arg| arg.contains('\0')) {
        return Some("acp.args must not contain NUL bytes".to_owned());
    }
    None
}

/// `url` with the password of its user info (`scheme://user:password@host`) replaced by
/// `***`, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{path}")
        }
        _ => url.to_owned(),
    }
}

/// Why a `cluster.host_id` is refused, or `None` if it is a good one. It names a NATS subject
/// token and a lease holder, so only letters, digits, `-` and `_`.
fn host_id_problem(host_id: &str) -> Option<&'static str> {
    if host_id.is_empty() {
        Some("it is empty")
    } else if host_id.len() > MAX_HOST_ID_LEN {
        Some("it is longer than 63 characters")
    } else if !host_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        Some("only ASCII letters, digits, '-' and '_' are allowed (it names NATS subjects)")
    } else {
        None
    }
}

/// The most gateways `gatewayd.advertised_urls` may list (laptops take no more).
pub const MAX_ADVERTISED_URLS: usize = 16;

/// Why a gateway URL may not be advertised to laptops, or `None`: `wss://host[:port]`, or
/// `ws://` to loopback only (a laptop sends its token there), without credentials, query or
/// anything a laptop would have to guess at.
fn advertised_url_problem(url: &str) -> Option<&'static str> {
    if url.len() > 512 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("not a URL (too long, or it holds spaces)");
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some("it must be wss:// (or ws:// to loopback)");
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') || rest.contains(['?', '#']) {
        return Some("it needs a host, and no user, query or fragment");
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    match scheme {
        "wss" => None,
        "ws" if agentworks_support::url::is_loopback_host(host) => None,
        "ws" => {
            Some("ws:// (no TLS) is for loopback only: laptops would send their tokens in clear")
        }
        _ => Some("it must be wss:// (or ws:// to loopback)"),
    }
}

/// The kernel's host name, the default `cluster.host_id`.
fn system_host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().to_owned()).filter(|n| !n.is_empty())
}

/// Where the config file path came from; named in errors so the person knows what to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// The `--config` flag.
    Flag,
    /// The `AGENTWORKS_CONFIG` environment variable.
    Env,
    /// [`DEFAULT_CONFIG_PATH`].
    Default,
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSource::Flag => f.write_str("--config"),
            ConfigSource::Env => f.write_str(ENV_CONFIG),
            ConfigSource::Default => f.write_str("the default path"),
        }
    }
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named by `--config` or `AGENTWORKS_CONFIG` does not exist.
    #[error("config file {path} (from {source_kind}) does not exist; fix the path or unset it")]
    Missing {
        path: PathBuf,
        source_kind: ConfigSource,
    },
    /// The file exists but could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped keys.
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    /// A path setting is relative; every root must be absolute so no daemon depends on its cwd.
    #[error("{key} must be an absolute path, got {path:?} (from {origin})")]
    RelativePath {
        key: &'static str,
        path: PathBuf,
        origin: String,
    },
    /// `[agentd.model]` lacks `base_url` or `model`.
    #[error("[agentd.model] has no {missing}: a model needs both base_url and model")]
    ModelIncomplete { missing: &'static str },
    /// `agentd.model.base_url` would send the API key where it must not go, or is no URL
    /// (shown with a password redacted).
    #[error("agentd.model.base_url {url:?} is refused: {problem}")]
    ModelUrl { url: String, problem: &'static str },
    /// A `[runnerd.providers.NAME]` table is unusable.
    #[error("[runnerd.providers.{name}] is refused: {problem}")]
    Provider { name: String, problem: String },
    /// A limit is zero, which would refuse everything.
    #[error("{key} must be greater than 0")]
    ZeroLimit { key: &'static str },
    /// A period is longer than its daemon can schedule sensibly (or at all: a huge one
    /// overflowed gatewayd's timers).
    #[error("{key} must be at most {max}, got {value}")]
    TooLarge {
        key: &'static str,
        max: u64,
        value: u64,
    },
    /// A name in `workspaced.allowed_users` is empty.
    #[error("workspaced.allowed_users contains an empty user name")]
    EmptyUserName,
    /// Part of `[cluster]` is set but not all a cluster needs.
    #[error(
        "[cluster] is half configured: {present} is set but {missing} is not; a cluster needs \
         both cluster.database_url (PostgreSQL) and cluster.nats_url (NATS): set {missing}, or \
         remove {present} to run on one host"
    )]
    HalfCluster {
        present: &'static str,
        missing: &'static str,
    },
    /// A cluster URL would carry the cluster's traffic to another machine unencrypted (shown
    /// with its password redacted).
    #[error("{key} {url:?} reaches {host}, which is not this machine, without TLS; {fix}")]
    ClusterInClear {
        key: &'static str,
        url: String,
        host: String,
        fix: &'static str,
    },
    /// `cluster.database_url`'s `sslmode` or `sslrootcert` is not usable.
    #[error("cluster.database_url {url:?}: {problem}")]
    DatabaseTls {
        url: String,
        problem: cluster_urls::DatabaseTlsProblem,
    },
    /// A cluster URL has the wrong scheme (shown with its password redacted).
    #[error("{key} must be a {expected} URL, got {url:?}")]
    ClusterUrl {
        key: &'static str,
        expected: &'static str,
        url: String,
    },
    /// `cluster.host_id` (set, or the host name it defaults to) is not usable.
    #[error(
        "cluster.host_id {host_id:?} (from {origin}) is refused: {problem}; set cluster.host_id"
    )]
    HostId {
        host_id: String,
        origin: &'static str,
        problem: &'static str,
    },
    /// A `gatewayd.advertised_urls` entry laptops could not, or must not, dial.
    #[error("gatewayd.advertised_urls {url:?} is refused: {problem}")]
    AdvertisedUrl { url: String, problem: &'static str },
    /// `agentd.workspaced_host` cannot be a cluster host id.
    #[error("agentd.workspaced_host {host:?} is refused: {problem}")]
    WorkspacedHost { host: String, problem: &'static str },
    /// An `[agentd.project_workspaced_hosts]` entry names no project folder or no host id.
    #[error("[agentd.project_workspaced_hosts] {folder:?} = {host:?} is refused: {problem}")]
    ProjectWorkspacedHost {
        folder: String,
        host: String,
        problem: &'static str,
    },
    /// A key that only means something in a cluster, without `[cluster]`.
    #[error(
        "{key} is set but [cluster] is not (database_url and nats_url): it only works in a \
         cluster; set [cluster] or remove {key}"
    )]
    NeedsCluster { key: &'static str },
    /// No `cluster.host_id` and the host name could not be read.
    #[error("cluster.host_id is not set and the host name cannot be read; set cluster.host_id")]
    NoHostId,
    /// The NATS credentials file cannot be read (missing, say).
    #[error("cluster.nats_credentials {path}: {source}")]
    CredentialsUnreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The NATS credentials file is not a regular file, or others than its owner may read it.
    #[error(
        "cluster.nats_credentials {path} {problem}; it holds this daemon's NATS secret: make it \
         a regular file readable by its owner only (chmod 600)"
    )]
    CredentialsExposed { path: PathBuf, problem: String },
}

impl Config {
    /// Loads the configuration from the real environment.
    ///
    /// Source order: explicit path (the `--config` flag) > env `AGENTWORKS_CONFIG` >
    /// [`DEFAULT_CONFIG_PATH`]. An explicit or env path that does not exist is an error; a
    /// missing default file means all defaults. Then the env overrides
    /// (`AGENTWORKS_STATE_ROOT`, `AGENTWORKS_DOCUMENTS_ROOT`, `AGENTWORKS_RUNTIME_DIR`, see
    /// [`Config`] for how they shape the other defaults), then validation (roots absolute,
    /// limits > 0).
    ///
    /// A relative `AGENTWORKS_STATE_ROOT`, `AGENTWORKS_DOCUMENTS_ROOT` or
    /// `AGENTWORKS_RUNTIME_DIR` is taken from the current directory, once, here (e.g.
    /// `AGENTWORKS_STATE_ROOT=.agentworks-quickstart agentworksctl status`): the settled roots
    /// are absolute, so nothing depends on the directory afterwards.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let cwd = std::env::current_dir().ok();
        Config::load_with_env(explicit, &|name| {
            let value = std::env::var_os(name)?;
            let is_root = [ENV_STATE_ROOT, ENV_DOCUMENTS_ROOT, ENV_RUNTIME_DIR].contains(&name);
            let path = PathBuf::from(&value);
            match &cwd {
                // Without a current directory it stays relative, and validation refuses it.
                Some(cwd) if is_root && !value.is_empty() && path.is_relative() => {
                    Some(cwd.join(path).to_string_lossy().into_owned())
                }
                _ => Some(value.to_string_lossy().into_owned()),
            }
        })
    }

    /// Same as [`Config::load`], with the environment passed in: `env` returns the value of a
    /// variable.
    pub fn load_with_env(
        explicit: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let (path, source_kind) = match (explicit, env(ENV_CONFIG)) {
            (Some(path), _) => (path.to_path_buf(), ConfigSource::Flag),
            (None, Some(path)) => (PathBuf::from(path), ConfigSource::Env),
            (None, None) => (PathBuf::from(DEFAULT_CONFIG_PATH), ConfigSource::Default),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if source_kind != ConfigSource::Default {
                    return Err(ConfigError::Missing { path, source_kind });
                }
                None
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let config = match text {
            Some(text) => Config::from_text(&text, &path, &env)?,
            None => {
                let defaults = ParsedConfig {
                    config: Config::default(),
                    file_sets_documents_root: false,
                    file_sets_runtime_dir: false,
                };
                defaults.settle(&env, "defaults")?
            }
        };
        config.check_nats_credentials()?;
        Ok(config)
    }

    /// Refuses a `cluster.nats_credentials` file that is missing, unreadable, not a regular
    /// file, or readable by its group or others.
    fn check_nats_credentials(&self) -> Result<(), ConfigError> {
        use std::os::unix::fs::PermissionsExt;
        let Some(path) = &self.cluster.nats_credentials else {
            return Ok(());
        };
        let metadata =
            std::fs::metadata(path).map_err(|source| ConfigError::CredentialsUnreadable {
                path: path.clone(),
                source,
            })?;
        let exposed = |problem: String| ConfigError::CredentialsExposed {
            path: path.clone(),
            problem,
        };
        if !metadata.is_file() {
            return Err(exposed("is not a regular file".to_owned()));
        }
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(exposed(format!(
                "is readable or writable by its group or others (mode {mode:04o})"
            )));
        }
        Ok(())
    }

    /// The configuration in `text`, the contents of the file at `path` (named in errors): parsed
    /// strictly, overridden from `env` (an empty value counts as unset) and validated, as
    /// [`Config::load_with_env`] does once it has read the file. Reads nothing but the host
    /// name (for a cluster without `host_id`); the NATS credentials file is checked by
    /// [`Config::load_with_env`] only.
    pub fn from_text(
        text: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let parsed = Config::parse(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        parsed.settle(&env, &path.display().to_string())
    }

    /// Checks `text` strictly against the file's schema (every key known, every value of its
    /// type), without the environment or validation: the error, if any, points at a line of
    /// `text`. For a file that is merged with others before it is loaded (quickstart's
    /// `--config`), so that a typo is reported in the person's own file.
    pub fn check_schema(text: &str) -> Result<(), toml::de::Error> {
        Config::parse(text).map(|_| ())
    }

    /// Parses the text of a config file (without env overrides or validation).
    fn parse(text: &str) -> Result<ParsedConfig, toml::de::Error> {
        let table: toml::Table = toml::from_str(text)?;
        let file_sets_documents_root = table.contains_key("documents_root");
        let file_sets_runtime_dir = table.contains_key("runtime_dir");
        let config: Config = toml::from_str(text)?;
        Ok(ParsedConfig {
            config,
            file_sets_documents_root,
            file_sets_runtime_dir,
        })
    }

    /// Checks that every root is absolute and every limit positive.
    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let model = self.agentd.model.as_ref();
        let paths: [(&'static str, Option<&Path>); 6] = [
            ("state_root", Some(&self.state_root)),
            ("documents_root", Some(&self.documents_root)),
            ("runtime_dir", Some(&self.runtime_dir)),
            ("workspaced.socket", self.workspaced.socket.as_deref()),
            ("agentd.cli_dir", Some(&self.agentd.cli_dir)),
            (
                "agentd.model.api_key_file",
                model.and_then(|m| m.api_key_file.as_deref()),
            ),
        ];
        let roots = self.agentd.outbound_root_certificates.iter();
        let roots = roots.map(|path| ("agentd.outbound_root_certificates", Some(path.as_path())));
        for (key, path) in paths.into_iter().chain(roots) {
            if let Some(path) = path
                && !path.is_absolute()
            {
                return Err(ConfigError::RelativePath {
                    key,
                    path: path.to_path_buf(),
                    origin: origin.to_owned(),
                });
            }
        }
        let ws = &self.workspaced;
        if ws.max_file_bytes == 0 {
            return Err(ConfigError::ZeroLimit {
                key: "workspaced.max_file_bytes",
            });
        }
        if ws.lock_timeout_ms == 0 {
            return Err(ConfigError::ZeroLimit {
                key: "workspaced.lock_timeout_ms",
            });
        }
        if ws.search_max_results == 0 {
            return Err(ConfigError::ZeroLimit {
                key: "workspaced.search_max_results",
            });
        }
        if ws.allowed_users.iter().any(|u| u.trim().is_empty()) {
            return Err(ConfigError::EmptyUserName);
        }
        let listener_limits = [
            ("agentd.max_connections", self.agentd.max_connections),
            (
                "agentd.max_connections_per_address",
                self.agentd.max_connections_per_address,
            ),
            (
                "agentd.max_body_bytes_in_flight",
                self.agentd.max_body_bytes_in_flight,
            ),
            (
                "agentd.max_sessions_per_token",
                self.agentd.max_sessions_per_token,
            ),
            ("gatewayd.max_connections", self.gatewayd.max_connections),
            (
                "gatewayd.max_connections_per_address",
                self.gatewayd.max_connections_per_address,
            ),
        ];
        for (key, value) in listener_limits {
            if value == 0 {
                return Err(ConfigError::ZeroLimit { key });
            }
        }
        if self.gatewayd.advertised_urls.len() > MAX_ADVERTISED_URLS {
            return Err(ConfigError::AdvertisedUrl {
                url: format!("({} URLs)", self.gatewayd.advertised_urls.len()),
                problem: "at most 16 gateways may be advertised",
            });
        }
        for url in &self.gatewayd.advertised_urls {
            if let Some(problem) = advertised_url_problem(url) {
                return Err(ConfigError::AdvertisedUrl {
                    url: url.clone(),
                    problem,
                });
            }
        }
        // gatewayd schedules its pings at now + heartbeat and drops a connection silent for
        // three; the laptop follows a heartbeat of at most 600 s. Unbounded, a huge value
        // overflowed the Instant arithmetic and panicked every executor session.
        let periods = [
            (
                "gatewayd.heartbeat_secs",
                self.gatewayd.heartbeat_secs,
                MAX_HEARTBEAT_SECS,
            ),
            (
                "gatewayd.token_recheck_ms",
                self.gatewayd.token_recheck_ms,
                MAX_TOKEN_RECHECK_MS,
            ),
        ];
        for (key, value, max) in periods {
            if value > max {
                return Err(ConfigError::TooLarge { key, max, value });
            }
        }
        if let Some(model) = model {
            if model.max_tool_rounds == 0 {
                return Err(ConfigError::ZeroLimit {
                    key: "agentd.model.max_tool_rounds",
                });
            }
            if model.request_timeout_secs == 0 {
                return Err(ConfigError::ZeroLimit {
                    key: "agentd.model.request_timeout_secs",
                });
            }
            if model.max_history_bytes == 0 {
                return Err(ConfigError::ZeroLimit {
                    key: "agentd.model.max_history_bytes",
                });
            }
            // Checked here, not at the first turn: a model URL that would carry the key in
            // clear must stop agentd (and quickstart) at start.
            for (missing, value) in [("base_url", &model.base_url), ("model", &model.model)] {
                if value.trim().is_empty() {
                    return Err(ConfigError::ModelIncomplete { missing });
                }
            }
            if let Some(problem) = agentworks_support::url::http_base_url_problem(&model.base_url) {
                return Err(ConfigError::ModelUrl {
                    url: redact_url(&model.base_url),
                    problem,
                });
            }
        }
        self.validate_runnerd(origin)?;
        self.validate_cluster(origin)
    }

    /// Positive limits; each provider with a known driver, a usable executable, a model, an
    /// upstream that keeps the key off the network in clear, and an absolute key file.
    fn validate_runnerd(&self, origin: &str) -> Result<(), ConfigError> {
        let runnerd = &self.runnerd;
        for (key, value) in [
            ("runnerd.turn_timeout_secs", runnerd.turn_timeout_secs),
            ("runnerd.max_processes", runnerd.max_processes),
            (
                "runnerd.max_memory_mib",
                runnerd.max_memory_mib.unwrap_or(1),
            ),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroLimit { key });
            }
        }
        if let Some(socket) = &runnerd.socket
            && !socket.is_absolute()
        {
            return Err(ConfigError::RelativePath {
                key: "runnerd.socket",
                path: socket.clone(),
                origin: origin.to_owned(),
            });
        }
        if runnerd.allowed_users.iter().any(|u| u.trim().is_empty()) {
            return Err(ConfigError::EmptyUserName);
        }
        for (name, provider) in &runnerd.providers {
            let bad = |problem: String| ConfigError::Provider {
                name: name.clone(),
                problem,
            };
            let name_ok = !name.is_empty()
                && name.len() <= 64
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                })
                && name != "api";
            if !name_ok {
                return Err(bad("a provider's name is 1 to 64 of a-z, 0-9, '-' and '_', and not \"api\" (the built-in agent)".to_owned()));
            }
            if !PROVIDER_DRIVERS.contains(&provider.driver.as_str()) {
                return Err(bad(format!(
                    "driver {:?} is not one runnerd has (it has: {})",
                    provider.driver,
                    PROVIDER_DRIVERS.join(", ")
                )));
            }
            let executable = Path::new(&provider.executable);
            if provider.executable.is_empty()
                || (!executable.is_absolute() && provider.executable.contains('/'))
            {
                return Err(bad(format!(
                    "executable {:?} must be an absolute path or a bare name found on PATH",
                    provider.executable
                )));
            }
            if provider.model.trim().is_empty() {
                return Err(bad("model is empty".to_owned()));
            }
            if let Some(problem) =
                agentworks_support::url::http_base_url_problem(&provider.upstream)
            {
                return Err(bad(format!(
                    "upstream {}: {problem}",
                    redact_url(&provider.upstream)
                )));
            }
            if let Some(key_file) = &provider.key_file
                && !key_file.is_absolute()
            {
                return Err(bad(format!(
                    "key_file {} must be an absolute path",
                    key_file.display()
                )));
            }
            if let Some(problem) = acp_problem(&provider.driver, provider.acp.as_ref()) {
                return Err(bad(problem));
            }
        }
        Ok(())
    }

    /// A cluster has both URLs (with the right schemes) or neither, an absolute credentials
    /// file only with NATS, and a usable host id.
    fn validate_cluster(&self, origin: &str) -> Result<(), ConfigError> {
        let cluster = &self.cluster;
        let (database, nats) = (&cluster.database_url, &cluster.nats_url);
        let half = |present, missing| Err(ConfigError::HalfCluster { present, missing });
        let nats_file = match (&cluster.nats_credentials, &cluster.nats_ca_file) {
            (Some(_), _) => Some("cluster.nats_credentials"),
            (None, Some(_)) => Some("cluster.nats_ca_file"),
            (None, None) => None,
        };
        match (database, nats, nats_file) {
            (Some(_), None, _) => return half("cluster.database_url", "cluster.nats_url"),
            (None, Some(_), _) => return half("cluster.nats_url", "cluster.database_url"),
            (None, None, Some(key)) => {
                return half(key, "cluster.database_url or cluster.nats_url");
            }
            _ => {}
        }
        let schemes: [(&'static str, &Option<String>, &'static str, &[&str]); 2] = [
            (
                "cluster.database_url",
                database,
                "PostgreSQL (postgres:// or postgresql://)",
                &["postgres://", "postgresql://"],
            ),
            (
                "cluster.nats_url",
                nats,
                "NATS (nats:// or tls://)",
                &["nats://", "tls://"],
            ),
        ];
        for (key, url, expected, prefixes) in schemes {
            if let Some(url) = url
                && !prefixes.iter().any(|p| url.starts_with(p))
            {
                return Err(ConfigError::ClusterUrl {
                    key,
                    expected,
                    url: redact_url(url),
                });
            }
        }
        let files = [
            ("cluster.nats_credentials", &cluster.nats_credentials),
            ("cluster.nats_ca_file", &cluster.nats_ca_file),
        ];
        for (key, path) in files {
            if let Some(path) = path
                && !path.is_absolute()
            {
                return Err(ConfigError::RelativePath {
                    key,
                    path: path.clone(),
                    origin: origin.to_owned(),
                });
            }
        }
        self.refuse_cluster_in_clear()?;
        let needs_cluster = [
            ("workspaced.serve_cluster", self.workspaced.serve_cluster),
            ("runnerd.serve_cluster", self.runnerd.serve_cluster),
            (
                "agentd.workspaced_host",
                self.agentd.workspaced_host.is_some(),
            ),
            (
                "[agentd.project_workspaced_hosts]",
                !self.agentd.project_workspaced_hosts.is_empty(),
            ),
        ];
        for (key, set) in needs_cluster {
            if set && !cluster.is_enabled() {
                return Err(ConfigError::NeedsCluster { key });
            }
        }
        if let Some(host) = &self.agentd.workspaced_host
            && let Some(problem) = host_id_problem(host)
        {
            return Err(ConfigError::WorkspacedHost {
                host: host.clone(),
                problem,
            });
        }
        for (folder, host) in &self.agentd.project_workspaced_hosts {
            // A project's folder is one name under the documents root, as workspaced takes it.
            let folder_problem = (folder.is_empty()
                || folder == "."
                || folder == ".."
                || folder.contains(['/', '\0']))
            .then_some("the key must be a project's folder: one name, no '/'");
            if let Some(problem) = folder_problem.or_else(|| host_id_problem(host)) {
                return Err(ConfigError::ProjectWorkspacedHost {
                    folder: folder.clone(),
                    host: host.clone(),
                    problem,
                });
            }
        }
        if let Some(host_id) = &cluster.host_id
            && let Some(problem) = host_id_problem(host_id)
        {
            return Err(ConfigError::HostId {
                host_id: host_id.clone(),
                origin: "the config file",
                problem,
            });
        }
        Ok(())
    }

    /// Fail closed on the network: a cluster URL that reaches another machine must use TLS
    /// (`tls://` for NATS, `sslmode=require` or stronger for PostgreSQL); plain is allowed to
    /// loopback (and a Unix socket) only, where the traffic never leaves this machine.
    fn refuse_cluster_in_clear(&self) -> Result<(), ConfigError> {
        let cluster = &self.cluster;
        if let Some(url) = &cluster.database_url {
            let parsed = cluster_urls::parse_database_url(url).map_err(|problem| {
                ConfigError::DatabaseTls {
                    url: redact_url(url),
                    problem,
                }
            })?;
            if let (cluster_urls::DatabaseTls::Off, Some(host)) = (parsed.tls, parsed.remote_host) {
                return Err(ConfigError::ClusterInClear {
                    key: "cluster.database_url",
                    url: redact_url(url),
                    host,
                    fix: "add ?sslmode=verify-full (or require: the certificate is verified \
                          either way) to the URL, with sslrootcert=/path/ca.pem for a private CA",
                });
            }
        }
        if let Some(url) = &cluster.nats_url
            && url.starts_with("nats://")
            && let Some(host) = cluster_urls::nats_remote_host(url)
        {
            return Err(ConfigError::ClusterInClear {
                key: "cluster.nats_url",
                url: redact_url(url),
                host,
                fix: "use tls://host:port (the NATS server needs a tls block), with \
                      cluster.nats_ca_file for a private CA",
            });
        }
        Ok(())
    }

    /// The path of workspaced's socket: `workspaced.socket`, else `<runtime_dir>/workspaced.sock`.
    pub fn workspaced_socket(&self) -> PathBuf {
        match &self.workspaced.socket {
            Some(path) => path.clone(),
            None => self.runtime_dir.join("workspaced.sock"),
        }
    }

    /// The path of agentd's socket: `agentd.socket`, else `<runtime_dir>/agentd.sock`.
    pub fn agentd_socket(&self) -> PathBuf {
        match &self.agentd.socket {
            Some(path) => path.clone(),
            None => self.runtime_dir.join("agentd.sock"),
        }
    }

    /// The path of gatewayd's socket: `gatewayd.socket`, else `<runtime_dir>/gatewayd.sock`.
    pub fn gatewayd_socket(&self) -> PathBuf {
        match &self.gatewayd.socket {
            Some(path) => path.clone(),
            None => self.runtime_dir.join("gatewayd.sock"),
        }
    }

    /// The path of runnerd's socket: `runnerd.socket`, else `<runtime_dir>/runnerd.sock`.
    pub fn runnerd_socket(&self) -> PathBuf {
        match &self.runnerd.socket {
            Some(path) => path.clone(),
            None => self.runtime_dir.join("runnerd.sock"),
        }
    }

    /// The state-root layout under `state_root`.
    pub fn layout(&self) -> StateLayout {
        StateLayout {
            root: self.state_root.clone(),
        }
    }
}

/// The environment variable a root (`state_root`, `documents_root`, `runtime_dir`) was taken
/// from, or `None` when it came from the file or the defaults. The documents root and the
/// runtime directory derive from `AGENTWORKS_STATE_ROOT` when their own variable is unset
/// (see [`Config`]); validation checks the state root first, so a relative one is named by
/// its own variable.
fn root_from_env(key: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<&'static str> {
    let variable = match key {
        "state_root" => ENV_STATE_ROOT,
        "documents_root" => ENV_DOCUMENTS_ROOT,
        "runtime_dir" => ENV_RUNTIME_DIR,
        _ => return None,
    };
    env(variable).map(|_| variable)
}

/// A parsed file plus which optional roots it set, which decides how the env defaults apply.
struct ParsedConfig {
    config: Config,
    file_sets_documents_root: bool,
    file_sets_runtime_dir: bool,
}

impl ParsedConfig {
    /// The environment overrides, then validation (`origin` names where the file came from).
    fn settle(
        self,
        env: &dyn Fn(&str) -> Option<String>,
        origin: &str,
    ) -> Result<Config, ConfigError> {
        self.settle_on_host(env, &system_host_name, origin)
    }

    /// [`ParsedConfig::settle`] with the host name passed in: a cluster without `host_id`
    /// gets `host_name()`, which must be a valid host id.
    fn settle_on_host(
        mut self,
        env: &dyn Fn(&str) -> Option<String>,
        host_name: &dyn Fn() -> Option<String>,
        origin: &str,
    ) -> Result<Config, ConfigError> {
        self.apply_env(env);
        self.config.validate(origin).map_err(|error| match error {
            ConfigError::RelativePath { key, path, .. }
                if let Some(variable) = root_from_env(key, env) =>
            {
                ConfigError::RelativePath {
                    key,
                    path,
                    origin: variable.to_owned(),
                }
            }
            other => other,
        })?;
        let cluster = &mut self.config.cluster;
        if cluster.is_enabled() && cluster.host_id.is_none() {
            let name = host_name().ok_or(ConfigError::NoHostId)?;
            if let Some(problem) = host_id_problem(&name) {
                return Err(ConfigError::HostId {
                    host_id: name,
                    origin: "the host name",
                    problem,
                });
            }
            cluster.host_id = Some(name);
        }
        Ok(self.config)
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let state_root_from_env = env(ENV_STATE_ROOT).map(PathBuf::from);
        if let Some(root) = &state_root_from_env {
            self.config.state_root = root.clone();
        }
        match env(ENV_RUNTIME_DIR) {
            Some(dir) => self.config.runtime_dir = PathBuf::from(dir),
            None => {
                if let (Some(root), false) = (&state_root_from_env, self.file_sets_runtime_dir) {
                    self.config.runtime_dir = root.join("run");
                }
            }
        }
        match env(ENV_DOCUMENTS_ROOT) {
            Some(dir) => self.config.documents_root = PathBuf::from(dir),
            None => {
                if let (Some(root), false) = (&state_root_from_env, self.file_sets_documents_root) {
                    self.config.documents_root = root.join("documents");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acp_table_is_required_with_driver_acp_only_and_names_a_known_agent_and_api() {
        let acp = |agent: &str, api: Option<&str>, args: &[&str]| AcpProviderConfig {
            agent: agent.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            api: api.map(str::to_owned),
        };
        assert_eq!(
            acp_problem("acp", Some(&acp("opencode", None, &["acp"]))),
            None
        );
        assert_eq!(
            acp_problem(
                "acp",
                Some(&acp("opencode", Some("chat_completions"), &["acp"]))
            ),
            None
        );
        assert_eq!(acp_problem("codex", None), None);
        let problem = |driver, table: Option<AcpProviderConfig>| {
            acp_problem(driver, table.as_ref()).expect("a problem")
        };
        assert!(problem("acp", None).contains("needs an [acp] table"));
        assert!(problem("codex", Some(acp("opencode", None, &[]))).contains("only for driver"));
        assert!(problem("acp", Some(acp("gemini", None, &[]))).contains("it knows: opencode"));
        assert!(
            problem("acp", Some(acp("opencode", Some("messages"), &[])))
                .contains("it speaks: chat_completions")
        );
        assert!(problem("acp", Some(acp("opencode", None, &["a\0b"]))).contains("NUL"));
    }
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("agentworks.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn the_shipped_config_documents_real_keys_with_their_defaults() {
        // Uncomment every `# key = value` and `# [table]` line of the shipped file, in file
        // order: it must parse (every documented key exists, with the right type) and give
        // the defaults.
        let shipped = include_str!("../../../packaging/agentworks.toml");
        let is_key = |line: &str| {
            line.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
        };
        let in_order: String = shipped
            .lines()
            .filter_map(|line| {
                if line.starts_with('[') {
                    return Some(line);
                }
                let rest = line.strip_prefix("# ")?;
                let is_table = rest.starts_with('[') && rest.ends_with(']');
                (is_table || is_key(rest)).then_some(rest)
            })
            .fold(String::new(), |mut out, line| {
                out.push_str(line);
                out.push('\n');
                out
            });
        assert!(in_order.contains("max_body_bytes_in_flight = "));
        let parsed = Config::parse(&in_order)
            .unwrap_or_else(|e| panic!("{e}\n{in_order}"))
            .config;
        let defaults = Config::default();
        let a = (&parsed.agentd, &defaults.agentd);
        assert_eq!(a.0.max_connections, a.1.max_connections);
        assert_eq!(
            a.0.max_connections_per_address,
            a.1.max_connections_per_address
        );
        assert_eq!(a.0.max_body_bytes_in_flight, a.1.max_body_bytes_in_flight);
        assert_eq!(a.0.max_sessions_per_token, a.1.max_sessions_per_token);
        assert_eq!(a.0.cli_dir, a.1.cli_dir);
        let g = (&parsed.gatewayd, &defaults.gatewayd);
        assert_eq!(g.0.max_connections, g.1.max_connections);
        assert_eq!(
            g.0.max_connections_per_address,
            g.1.max_connections_per_address
        );
        assert_eq!(
            parsed.workspaced.max_file_bytes,
            defaults.workspaced.max_file_bytes
        );
    }

    #[test]
    fn empty_file_gives_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "");
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        assert_eq!(c.state_root, Path::new("/var/lib/agentworks"));
        assert_eq!(c.documents_root, Path::new("/var/lib/agentworks-documents"));
        assert_eq!(c.runtime_dir, Path::new("/run/agentworks"));
        assert_eq!(
            c.workspaced_socket(),
            Path::new("/run/agentworks/workspaced.sock")
        );
        assert_eq!(c.workspaced.allowed_users, vec!["agentworks".to_owned()]);
        assert_eq!(c.workspaced.max_file_bytes, 8 * 1024 * 1024);
        assert_eq!(c.workspaced.lock_timeout_ms, 30_000);
        assert_eq!(c.workspaced.search_max_results, 200);
        assert_eq!(c.agentd.listen.to_string(), "127.0.0.1:8470");
        assert_eq!(c.gatewayd.listen.to_string(), "127.0.0.1:8471");
        assert_eq!(c.layout().root, Path::new("/var/lib/agentworks"));
    }

    #[test]
    fn full_file_is_parsed_into_every_section() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            r#"
state_root = "/srv/aw"
documents_root = "/srv/docs"
runtime_dir = "/run/aw"
[workspaced]
socket = "/run/aw/ws.sock"
allowed_users = ["alice", "bob"]
max_file_bytes = 1024
lock_timeout_ms = 5
search_max_results = 7
[agentd]
listen = "127.0.0.1:8080"
[gatewayd]
listen = "0.0.0.0:9000"
public_url = "wss://gw.example.com/"
"#,
        );
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        assert_eq!(c.state_root, Path::new("/srv/aw"));
        assert_eq!(c.documents_root, Path::new("/srv/docs"));
        assert_eq!(c.runtime_dir, Path::new("/run/aw"));
        assert_eq!(c.workspaced_socket(), Path::new("/run/aw/ws.sock"));
        assert_eq!(c.workspaced.allowed_users, vec!["alice", "bob"]);
        assert_eq!(c.workspaced.max_file_bytes, 1024);
        assert_eq!(c.workspaced.lock_timeout_ms, 5);
        assert_eq!(c.workspaced.search_max_results, 7);
        assert_eq!(c.agentd.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.agentd.public_url(), "http://127.0.0.1:8080");
        assert_eq!(c.gatewayd.public_url(), "wss://gw.example.com");
    }

    #[test]
    fn precedence_flag_then_env_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("flag.toml");
        let envp = dir.path().join("env.toml");
        std::fs::write(&flag, "state_root = \"/from/flag\"").unwrap();
        std::fs::write(&envp, "state_root = \"/from/env\"").unwrap();
        let env = env_of(&[(ENV_CONFIG, envp.to_str().unwrap())]);
        let c = Config::load_with_env(Some(&flag), &env).unwrap();
        assert_eq!(c.state_root, Path::new("/from/flag"));
        let c = Config::load_with_env(None, &env).unwrap();
        assert_eq!(c.state_root, Path::new("/from/env"));
    }

    #[test]
    fn missing_explicit_or_env_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let err = Config::load_with_env(Some(&missing), &env_of(&[])).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Missing {
                    source_kind: ConfigSource::Flag,
                    ..
                }
            ),
            "{err}"
        );
        let env = env_of(&[(ENV_CONFIG, missing.to_str().unwrap())]);
        let err = Config::load_with_env(None, &env).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Missing {
                    source_kind: ConfigSource::Env,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn env_overrides_beat_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "state_root = \"/f/state\"\ndocuments_root = \"/f/docs\"\nruntime_dir = \"/f/run\"\n",
        );
        let env = env_of(&[
            (ENV_STATE_ROOT, "/e/state"),
            (ENV_DOCUMENTS_ROOT, "/e/docs"),
            (ENV_RUNTIME_DIR, "/e/run"),
        ]);
        let c = Config::load_with_env(Some(&path), &env).unwrap();
        assert_eq!(c.state_root, Path::new("/e/state"));
        assert_eq!(c.documents_root, Path::new("/e/docs"));
        assert_eq!(c.runtime_dir, Path::new("/e/run"));
    }

    #[test]
    fn private_state_root_gets_private_runtime_and_documents() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "");
        let env = env_of(&[(ENV_STATE_ROOT, "/tmp/aw")]);
        let c = Config::load_with_env(Some(&path), &env).unwrap();
        assert_eq!(c.runtime_dir, Path::new("/tmp/aw/run"));
        assert_eq!(c.documents_root, Path::new("/tmp/aw/documents"));
        assert_eq!(
            c.workspaced_socket(),
            Path::new("/tmp/aw/run/workspaced.sock")
        );

        // The file's own settings still win over the derived defaults.
        let path = write(
            dir.path(),
            "runtime_dir = \"/f/run\"\ndocuments_root = \"/f/docs\"\n",
        );
        let c = Config::load_with_env(Some(&path), &env).unwrap();
        assert_eq!(c.runtime_dir, Path::new("/f/run"));
        assert_eq!(c.documents_root, Path::new("/f/docs"));
    }

    #[test]
    fn empty_env_value_counts_as_unset() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "");
        let env = env_of(&[(ENV_STATE_ROOT, ""), (ENV_CONFIG, "")]);
        let c = Config::load_with_env(Some(&path), &env).unwrap();
        assert_eq!(c.state_root, Path::new("/var/lib/agentworks"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "stat_root = \"/x\"",
            "[workspaced]\nmax_file_byte = 3",
            "[unknownd]\nx = 1",
        ] {
            let path = write(dir.path(), text);
            let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{text}: {err}");
        }
    }

    #[test]
    fn outbound_root_certificates_are_absolute_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "[agentd]\noutbound_root_certificates = [\"/etc/agentworks/ca.pem\", \"/x/b.pem\"]",
        );
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        assert_eq!(
            c.agentd.outbound_root_certificates,
            [Path::new("/etc/agentworks/ca.pem"), Path::new("/x/b.pem")]
        );
        let path = write(
            dir.path(),
            "[agentd]\noutbound_root_certificates = [\"/etc/ca.pem\", \"ca.pem\"]",
        );
        let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::RelativePath {
                    key: "agentd.outbound_root_certificates",
                    path,
                    ..
                } if path == Path::new("ca.pem")
            ),
            "{err}"
        );
    }

    #[test]
    fn relative_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "state_root = \"relative/state\"");
        let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::RelativePath {
                    key: "state_root",
                    ..
                }
            ),
            "{err}"
        );
        let path = write(dir.path(), "[workspaced]\nsocket = \"ws.sock\"");
        let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::RelativePath {
                    key: "workspaced.socket",
                    ..
                }
            ),
            "{err}"
        );
        let path = write(dir.path(), "");
        let env = env_of(&[(ENV_RUNTIME_DIR, "run")]);
        let err = Config::load_with_env(Some(&path), &env).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::RelativePath {
                    key: "runtime_dir",
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A relative root from the environment is named as coming from its variable, with or
    /// without a file (it used to say "from defaults" without one).
    #[test]
    fn a_relative_root_from_the_environment_names_its_variable() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "");
        for (variable, key, with_file) in [
            (ENV_STATE_ROOT, "state_root", false),
            (ENV_STATE_ROOT, "state_root", true),
            (ENV_DOCUMENTS_ROOT, "documents_root", true),
        ] {
            let explicit = with_file.then_some(file.as_path());
            let err = Config::load_with_env(explicit, &env_of(&[(variable, ".qs")])).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, ConfigError::RelativePath { key: k, origin, .. }
                    if *k == key && origin == variable),
                "{variable}: {text}"
            );
            assert!(text.contains(&format!("(from {variable})")), "{text}");
        }
        // A relative root in the file is still the file's.
        let file = write(dir.path(), "state_root = \"relative\"");
        let err = Config::load_with_env(Some(&file), &env_of(&[])).unwrap_err();
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
    }

    /// [`Config::check_schema`] reports an unknown key at its line of the text it was given,
    /// and takes a model table whose `base_url` and `model` come from elsewhere.
    #[test]
    fn the_schema_check_points_at_the_line_of_the_text() {
        assert!(Config::check_schema("[agentd.model]\nmax_tool_rounds = 3\n[gatewayd]\n").is_ok());
        let err =
            Config::check_schema("[agentd]\nmax_connections = 7\n\n[gatewayd]\nheartbeat = 5\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("line 5"), "{err}");
        assert!(err.contains("unknown field `heartbeat`"), "{err}");
        let err = Config::check_schema("[agentd]\nmax_connections = \"many\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn zero_limits_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (text, key) in [
            (
                "[workspaced]\nmax_file_bytes = 0",
                "workspaced.max_file_bytes",
            ),
            (
                "[workspaced]\nlock_timeout_ms = 0",
                "workspaced.lock_timeout_ms",
            ),
            (
                "[workspaced]\nsearch_max_results = 0",
                "workspaced.search_max_results",
            ),
            ("[agentd]\nmax_connections = 0", "agentd.max_connections"),
            (
                "[agentd]\nmax_connections_per_address = 0",
                "agentd.max_connections_per_address",
            ),
            (
                "[agentd]\nmax_body_bytes_in_flight = 0",
                "agentd.max_body_bytes_in_flight",
            ),
            (
                "[agentd]\nmax_sessions_per_token = 0",
                "agentd.max_sessions_per_token",
            ),
            (
                "[gatewayd]\nmax_connections_per_address = 0",
                "gatewayd.max_connections_per_address",
            ),
        ] {
            let path = write(dir.path(), text);
            let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
            assert!(
                matches!(err, ConfigError::ZeroLimit { key: k } if k == key),
                "{err}"
            );
        }
    }

    #[test]
    fn gateway_periods_are_bounded() {
        // Caught by fuzz/checks/config_load.rs: i64::MAX seconds overflowed gatewayd's timers.
        let dir = tempfile::tempdir().unwrap();
        for (text, key) in [
            (
                "[gatewayd]\nheartbeat_secs = 9223372036854775807",
                "gatewayd.heartbeat_secs",
            ),
            (
                "[gatewayd]\nheartbeat_secs = 601",
                "gatewayd.heartbeat_secs",
            ),
            (
                "[gatewayd]\ntoken_recheck_ms = 3600001",
                "gatewayd.token_recheck_ms",
            ),
        ] {
            let path = write(dir.path(), text);
            let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
            assert!(
                matches!(err, ConfigError::TooLarge { key: k, .. } if k == key),
                "{err}"
            );
        }
        let path = write(
            dir.path(),
            "[gatewayd]\nheartbeat_secs = 600\ntoken_recheck_ms = 3600000",
        );
        assert!(Config::load_with_env(Some(&path), &env_of(&[])).is_ok());
    }

    #[test]
    fn model_section_is_parsed_with_defaults_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "");
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        assert!(c.agentd.model.is_none());

        let path = write(
            dir.path(),
            "[agentd.model]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n",
        );
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        let m = c.agentd.model.unwrap();
        assert_eq!(m.base_url, "http://127.0.0.1:9/v1");
        assert_eq!(m.model, "m");
        assert_eq!(m.api_key_file, None);
        assert_eq!(m.max_tool_rounds, 16);
        assert_eq!(m.request_timeout_secs, 300);

        let path = write(
            dir.path(),
            "[agentd.model]\nbase_url = \"https://x/v1\"\nmodel = \"m\"\napi_key_file = \"/etc/k\"\nmax_tool_rounds = 3\nrequest_timeout_secs = 7\n",
        );
        let m = Config::load_with_env(Some(&path), &env_of(&[]))
            .unwrap()
            .agentd
            .model
            .unwrap();
        assert_eq!(m.api_key_file.as_deref(), Some(Path::new("/etc/k")));
        assert_eq!((m.max_tool_rounds, m.request_timeout_secs), (3, 7));
        assert_eq!(m.max_history_bytes, 256 * 1024);
        assert!(!format!("{m:?}").contains("secret"));

        for (text, expect) in [
            (
                "[agentd.model]\nbase_url = \"https://x/v1\"\nmodel = \"m\"\napi_key = \"k\"",
                "parse",
            ),
            ("[agentd.model]\nmodel = \"m\"", "base_url"),
            ("[agentd.model]\nbase_url = \"https://x/v1\"", "model"),
            (
                "[agentd.model]\nbase_url = \"https://x/v1\"\nmodel = \"m\"\nmax_tool_rounds = 0",
                "agentd.model.max_tool_rounds",
            ),
            (
                "[agentd.model]\nbase_url = \"https://x/v1\"\nmodel = \"m\"\nrequest_timeout_secs = 0",
                "agentd.model.request_timeout_secs",
            ),
            (
                "[agentd.model]\nbase_url = \"https://x/v1\"\nmodel = \"m\"\napi_key_file = \"k\"",
                "agentd.model.api_key_file",
            ),
            ("[agentd]\ncli_dir = \"target/debug\"", "agentd.cli_dir"),
            // The key would cross the network in clear: refused at start, not at a turn.
            (
                "[agentd.model]\nbase_url = \"http://example.com/v1\"\nmodel = \"m\"",
                "url",
            ),
            ("[agentd.model]\nbase_url = \"x\"\nmodel = \"m\"", "url"),
        ] {
            let path = write(dir.path(), text);
            let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
            let ok = match (&err, expect) {
                (ConfigError::Parse { .. }, "parse") => true,
                (ConfigError::ModelIncomplete { missing }, k) => *missing == k,
                (ConfigError::ModelUrl { .. }, "url") => true,
                (ConfigError::ZeroLimit { key }, k) => *key == k,
                (ConfigError::RelativePath { key, .. }, k) => *key == k,
                _ => false,
            };
            assert!(ok, "{text}: {err}");
        }
        let path = write(
            dir.path(),
            "[agentd.model]\nbase_url = \"http://u:hunter2@example.com/v1\"\nmodel = \"m\"",
        );
        let err = Config::load_with_env(Some(&path), &env_of(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("loopback host only") && !err.contains("hunter2"),
            "{err}"
        );
    }

    /// `text` settled on a host named `host` (or one whose name cannot be read).
    fn on_host(text: &str, host: Option<&str>) -> Result<Config, ConfigError> {
        let host = host.map(str::to_owned);
        Config::parse(text)
            .unwrap()
            .settle_on_host(&env_of(&[]), &|| host.clone(), "test")
    }

    const BOTH_URLS: &str = "[cluster]\ndatabase_url = \"postgres://gw:secret@db.internal:5432/agentworks?sslmode=verify-full\"\nnats_url = \"tls://nats.internal:4222\"\n";

    #[test]
    fn no_cluster_section_is_one_host_and_needs_no_host_name() {
        let c = on_host("", None).unwrap();
        assert!(!c.cluster.is_enabled());
        assert_eq!(c.cluster.host_id, None);
        let c = on_host("[cluster]\n", None).unwrap();
        assert!(!c.cluster.is_enabled());
    }

    #[test]
    fn a_full_cluster_is_parsed_and_host_id_defaults_to_the_host_name() {
        let c = on_host(BOTH_URLS, Some("web-1")).unwrap();
        assert!(c.cluster.is_enabled());
        assert_eq!(c.cluster.host_id.as_deref(), Some("web-1"));
        assert_eq!(
            c.cluster.nats_url.as_deref(),
            Some("tls://nats.internal:4222")
        );
        let text = format!("{BOTH_URLS}host_id = \"gw_2\"\n");
        let c = on_host(&text, Some("web-1")).unwrap();
        assert_eq!(c.cluster.host_id.as_deref(), Some("gw_2"));
        // The password never shows in the debug output.
        let debug = format!("{:?}", c.cluster);
        assert!(!debug.contains("secret"), "{debug}");
        assert!(debug.contains("postgres://gw:***@db.internal:5432/agentworks?"));
    }

    #[test]
    fn a_half_configured_cluster_is_refused_naming_what_is_missing() {
        for (text, present, missing) in [
            (
                "[cluster]\ndatabase_url = \"postgres://db/aw\"",
                "cluster.database_url",
                "cluster.nats_url",
            ),
            (
                "[cluster]\nnats_url = \"nats://127.0.0.1:4222\"",
                "cluster.nats_url",
                "cluster.database_url",
            ),
            (
                "[cluster]\nnats_credentials = \"/etc/agentworks/nats.creds\"",
                "cluster.nats_credentials",
                "cluster.database_url or cluster.nats_url",
            ),
        ] {
            let err = on_host(text, Some("h")).unwrap_err();
            assert!(
                matches!(&err, ConfigError::HalfCluster { present: p, missing: m }
                    if *p == present && *m == missing),
                "{text}: {err}"
            );
            let message = err.to_string();
            assert!(message.contains(&format!("{missing} is not")), "{message}");
        }
    }

    #[test]
    fn advertised_gateways_must_be_wss_or_loopback_and_carry_nothing_else() {
        for good in [
            "wss://gw.example.com:8471",
            "wss://[2001:db8::1]:8471",
            "ws://127.0.0.1:8471",
        ] {
            assert_eq!(advertised_url_problem(good), None, "{good}");
        }
        for bad in [
            "gw.example.com:8471",
            "ws://gw.example.com:8471",
            "https://gw.example.com",
            "wss://user:pw@gw.example.com",
            "wss://gw.example.com/?x=1",
            "wss://",
            "wss://gw .example.com",
        ] {
            assert!(advertised_url_problem(bad).is_some(), "{bad}");
        }
        let err = on_host(
            "[gatewayd]\nadvertised_urls = [\"ws://10.0.0.2:8471\"]",
            Some("h"),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::AdvertisedUrl { .. }), "{err}");
        let ok = on_host(
            "[gatewayd]\nadvertised_urls = [\"wss://a.example:8471\", \"wss://b.example:8471\"]",
            Some("h"),
        )
        .unwrap();
        assert_eq!(ok.gatewayd.advertised_urls.len(), 2);
    }

    #[test]
    fn cluster_only_keys_need_a_cluster_and_a_workspaced_host_must_be_a_host_id() {
        for (text, key) in [
            (
                "[workspaced]\nserve_cluster = true",
                "workspaced.serve_cluster",
            ),
            ("[runnerd]\nserve_cluster = true", "runnerd.serve_cluster"),
            (
                "[agentd]\nworkspaced_host = \"storage-1\"",
                "agentd.workspaced_host",
            ),
            (
                "[agentd.project_workspaced_hosts]\narchive = \"storage-2\"",
                "[agentd.project_workspaced_hosts]",
            ),
        ] {
            let err = on_host(text, Some("h")).unwrap_err();
            assert!(
                matches!(&err, ConfigError::NeedsCluster { key: k } if *k == key),
                "{text}: {err}"
            );
            assert!(err.to_string().contains("only works in a cluster"), "{err}");
        }
        let cluster = "[cluster]\ndatabase_url = \"postgres://127.0.0.1/aw\"\n\
                       nats_url = \"nats://127.0.0.1:4222\"\nhost_id = \"a\"\n";
        let ok = on_host(
            &format!(
                "[workspaced]\nserve_cluster = true\n[runnerd]\nserve_cluster = true\n\
                 [agentd]\nworkspaced_host = \"s-1\"\n{cluster}"
            ),
            Some("h"),
        )
        .unwrap();
        assert!(ok.runnerd.serve_cluster);
        assert!(ok.workspaced.serve_cluster);
        assert_eq!(ok.agentd.workspaced_host.as_deref(), Some("s-1"));
        let err = on_host(
            &format!("[agentd]\nworkspaced_host = \"a.b\"\n{cluster}"),
            Some("h"),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::WorkspacedHost { .. }), "{err}");
        let ok = on_host(
            &format!("[agentd.project_workspaced_hosts]\narchive = \"s-2\"\n{cluster}"),
            Some("h"),
        )
        .unwrap();
        assert_eq!(
            ok.agentd
                .project_workspaced_hosts
                .get("archive")
                .map(String::as_str),
            Some("s-2")
        );
        for entry in [
            "\"a/b\" = \"s-2\"",
            "\"..\" = \"s-2\"",
            "\"\" = \"s-2\"",
            "archive = \"s.2\"",
            "archive = \"\"",
        ] {
            let err = on_host(
                &format!("[agentd.project_workspaced_hosts]\n{entry}\n{cluster}"),
                Some("h"),
            )
            .unwrap_err();
            assert!(
                matches!(err, ConfigError::ProjectWorkspacedHost { .. }),
                "{entry}: {err}"
            );
            assert!(err.to_string().contains("is refused"), "{err}");
        }
    }

    #[test]
    fn cluster_urls_with_the_wrong_scheme_are_refused_without_their_password() {
        for (text, key) in [
            (
                "[cluster]\ndatabase_url = \"mysql://u:hunter2@db/aw\"\nnats_url = \"nats://n:4222\"",
                "cluster.database_url",
            ),
            (
                "[cluster]\ndatabase_url = \"host=db user=aw\"\nnats_url = \"nats://n:4222\"",
                "cluster.database_url",
            ),
            (
                "[cluster]\ndatabase_url = \"postgresql://db/aw\"\nnats_url = \"http://n:4222\"",
                "cluster.nats_url",
            ),
        ] {
            let err = on_host(text, Some("h")).unwrap_err();
            assert!(
                matches!(&err, ConfigError::ClusterUrl { key: k, .. } if *k == key),
                "{text}: {err}"
            );
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn cluster_urls_to_another_machine_without_tls_are_refused() {
        for (text, key, host, fix) in [
            (
                "database_url = \"postgres://gw:hunter2@db.internal/aw\"\n\
                 nats_url = \"tls://nats.internal:4222\"",
                "cluster.database_url",
                "db.internal",
                "sslmode=verify-full",
            ),
            (
                "database_url = \"postgres://gw@db.internal/aw?sslmode=prefer\"\n\
                 nats_url = \"tls://nats.internal:4222\"",
                "cluster.database_url",
                "db.internal",
                "sslmode=verify-full",
            ),
            (
                "database_url = \"postgres://gw@127.0.0.1/aw?host=10.0.0.7\"\n\
                 nats_url = \"nats://127.0.0.1:4222\"",
                "cluster.database_url",
                "10.0.0.7",
                "sslmode=verify-full",
            ),
            (
                "database_url = \"postgres://gw@db.internal/aw?sslmode=require\"\n\
                 nats_url = \"nats://agentd:hunter2@nats.internal:4222\"",
                "cluster.nats_url",
                "nats.internal",
                "use tls://",
            ),
        ] {
            let err = on_host(&format!("[cluster]\n{text}\nhost_id = \"h\"\n"), None).unwrap_err();
            assert!(
                matches!(&err, ConfigError::ClusterInClear { key: k, host: h, .. }
                    if *k == key && h == host),
                "{text}: {err}"
            );
            let message = err.to_string();
            assert!(message.contains(fix), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
        // This machine: plain is fine (loopback, a Unix socket).
        for text in [
            "database_url = \"postgres://gw@127.0.0.1:5432/aw\"\nnats_url = \"nats://127.0.0.1:4222\"",
            "database_url = \"postgres://gw@%2Frun%2Fpostgresql/aw\"\nnats_url = \"nats://[::1]:4222\"",
            "database_url = \"postgres://gw@localhost/aw\"\nnats_url = \"nats://localhost:4222\"",
        ] {
            let text = format!("[cluster]\n{text}\nhost_id = \"h\"\n");
            assert!(on_host(&text, None).is_ok(), "{text}");
        }
        // TLS to another machine, with a private CA for each.
        let text = "[cluster]\ndatabase_url = \"postgres://gw@db.internal/aw?sslmode=require&\
                    sslrootcert=/etc/agentworks/ca.pem\"\nnats_url = \"tls://nats.internal\"\n\
                    nats_ca_file = \"/etc/agentworks/ca.pem\"\nhost_id = \"h\"\n";
        let c = on_host(text, None).unwrap();
        assert_eq!(
            c.cluster.nats_ca_file.as_deref(),
            Some(Path::new("/etc/agentworks/ca.pem"))
        );
    }

    #[test]
    fn bad_tls_parameters_and_stray_ca_files_are_refused() {
        let with = |extra: &str| format!("{BOTH_URLS}host_id = \"h\"\n{extra}");
        let err = on_host(&with("nats_ca_file = \"ca.pem\"\n"), None).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::RelativePath {
                    key: "cluster.nats_ca_file",
                    ..
                }
            ),
            "{err}"
        );
        let text = "[cluster]\nnats_ca_file = \"/etc/agentworks/ca.pem\"\n";
        let err = on_host(text, None).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::HalfCluster {
                    present: "cluster.nats_ca_file",
                    ..
                }
            ),
            "{err}"
        );
        for (query, problem) in [
            ("sslmode=verify", "sslmode=\"verify\""),
            ("sslmode=require&sslrootcert=ca.pem", "absolute"),
            ("sslrootcert=/ca.pem", "sslmode does not ask for TLS"),
        ] {
            let text = format!(
                "[cluster]\ndatabase_url = \"postgres://gw:hunter2@127.0.0.1/aw?{query}\"\n\
                 nats_url = \"nats://127.0.0.1:4222\"\nhost_id = \"h\"\n"
            );
            let err = on_host(&text, None).unwrap_err();
            assert!(matches!(&err, ConfigError::DatabaseTls { .. }), "{err}");
            let message = err.to_string();
            assert!(message.contains(problem), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
    }

    #[test]
    fn bad_host_ids_are_refused_set_or_defaulted() {
        for bad in ["", "web.example.com", "a b", "gw>", "é", &"x".repeat(64)] {
            let text = format!("{BOTH_URLS}host_id = {bad:?}\n");
            let err = on_host(&text, Some("fine")).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ConfigError::HostId {
                        origin: "the config file",
                        ..
                    }
                ),
                "{bad:?}: {err}"
            );
        }
        assert!(
            on_host(
                &format!("{BOTH_URLS}host_id = \"{}\"\n", "x".repeat(63)),
                None
            )
            .is_ok()
        );
        // The host name it defaults to is checked the same way, and the message says to set it.
        let err = on_host(BOTH_URLS, Some("web1.example.com")).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::HostId {
                    origin: "the host name",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("set cluster.host_id"), "{err}");
        let err = on_host(BOTH_URLS, None).unwrap_err();
        assert!(matches!(err, ConfigError::NoHostId), "{err}");
    }

    #[test]
    fn nats_credentials_must_be_absolute_present_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{BOTH_URLS}host_id = \"h\"\nnats_credentials = \"nats.creds\"\n");
        let err = on_host(&text, None).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::RelativePath {
                    key: "cluster.nats_credentials",
                    ..
                }
            ),
            "{err}"
        );

        let creds = dir.path().join("nats.creds");
        let config_with = |creds: &Path| {
            write(
                dir.path(),
                &format!(
                    "{BOTH_URLS}host_id = \"h\"\nnats_credentials = {:?}\n",
                    creds
                ),
            )
        };
        // Missing.
        let path = config_with(&creds);
        let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
        assert!(
            matches!(&err, ConfigError::CredentialsUnreadable { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        // Readable by its group, then by everyone.
        std::fs::write(&creds, "-----BEGIN NATS USER JWT-----").unwrap();
        for mode in [0o640, 0o604, 0o660] {
            std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
            assert!(
                matches!(err, ConfigError::CredentialsExposed { .. }),
                "{mode:o}: {err}"
            );
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        // A directory is not a credentials file.
        let path = config_with(dir.path());
        let err = Config::load_with_env(Some(&path), &env_of(&[])).unwrap_err();
        assert!(
            matches!(err, ConfigError::CredentialsExposed { .. }),
            "{err}"
        );
        // Owner-only: accepted.
        let path = config_with(&creds);
        std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Config::load_with_env(Some(&path), &env_of(&[])).unwrap();
        assert_eq!(c.cluster.nats_credentials.as_deref(), Some(creds.as_path()));
        std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(Config::load_with_env(Some(&path), &env_of(&[])).is_ok());
    }

    #[test]
    fn urls_are_redacted_only_where_they_carry_a_password() {
        assert_eq!(
            redact_url("postgres://u:p@w@h:5/db?sslmode=require"),
            "postgres://u:***@h:5/db?sslmode=require"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn missing_default_file_means_defaults() {
        // Only meaningful where no system config is installed (the test machines).
        if Path::new(DEFAULT_CONFIG_PATH).exists() {
            return;
        }
        let env = env_of(&[(ENV_STATE_ROOT, "/tmp/aw-default-test")]);
        let c = Config::load_with_env(None, &env).unwrap();
        assert_eq!(c.state_root, Path::new("/tmp/aw-default-test"));
        assert_eq!(c.runtime_dir, Path::new("/tmp/aw-default-test/run"));
        assert_eq!(c.workspaced.max_file_bytes, 8 * 1024 * 1024);
    }

    #[test]
    fn unreadable_default_is_not_treated_as_missing() {
        // A directory where the file should be: reading fails with something else than NotFound.
        let dir = tempfile::tempdir().unwrap();
        let err = Config::load_with_env(Some(dir.path()), &env_of(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}
