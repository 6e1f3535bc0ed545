//! The command line of `agentworksctl`, the operator CLI.

use clap::{Args as ClapArgs, CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

/// Administer agentworks: users, projects, members, tokens, receipts, daemon status, and a
/// private quickstart stack.
///
/// agentworksctl talks to agentd's socket (operator endpoints: root and the agentworks-admin
/// group only). It finds it through the same configuration as the daemons: --config, else
/// $AGENTWORKS_CONFIG, else /etc/agentworks/agentworks.toml; AGENTWORKS_STATE_ROOT (relative
/// to the current directory, or absolute) selects another state root, e.g. a quickstart's:
///
///   AGENTWORKS_STATE_ROOT=.agentworks-quickstart agentworksctl user list
///
/// With none of these, and no system install (/etc/agentworks/agentworks.toml or
/// /run/agentworks/agentd.sock), it uses a running quickstart of yours: the one in this
/// directory, else the only one (each records itself under $XDG_STATE_HOME/agentworksctl,
/// default ~/.local/state, while it runs). It says on stderr which one it used, and names the
/// quickstarts it passed over for a system install.
#[derive(Debug, Parser)]
#[command(name = "agentworksctl", version)]
pub struct Cli {
    /// The TOML configuration file.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Start every daemon in the foreground on a private state root (loopback only, all as
    /// the current user), create a demo user, workflow, code project (demo-code) and token,
    /// and print the console URL, the MCP URL and a client configuration; Ctrl-C stops them
    /// all. Running it again reuses the state root and prints the same token while it is
    /// valid (it is kept in the state root's quickstart-token, 0600); a revoked or expired one
    /// is replaced, and earlier quickstart tokens are revoked. While it runs, agentworksctl's
    /// other commands find it without AGENTWORKS_STATE_ROOT (see agentworksctl --help).
    ///
    /// The model's URL, both ports and the --config file (against the configuration's
    /// schema, each mistake named at its line of that file) are checked before anything
    /// starts.
    ///
    /// --config FILE is merged into the configuration quickstart writes: every section of the
    /// file is kept (e.g. [agentd.model], limits), except what quickstart must own, which it
    /// sets itself: state_root, documents_root and runtime_dir (from --state-root), every
    /// socket, agentd's and gatewayd's listen (from --port and --gateway-port) and the
    /// allowed users (every daemon runs as you). --model-url/--model/--model-key-file win over
    /// the file's [agentd.model]. Without a model a chat turn answers model_not_configured.
    ///
    /// agentworks-runnerd, the fourth daemon, runs coding CLIs as a chat's agent. Give it one
    /// with --provider codex=PATH --provider-upstream URL [--provider-key-file FILE]
    /// [--provider-model NAME], or with [runnerd.providers.NAME] tables in --config (a
    /// --provider replaces the file's provider of the same name; the others are kept).
    /// Without a provider runnerd runs with none. A provider whose executable is missing is
    /// listed as unavailable (the banner and agentworksctl status say why), not refused.
    #[command(verbatim_doc_comment)]
    Quickstart {
        /// The private state root.
        #[arg(long, value_name = "DIR", default_value = crate::deployment::DEFAULT_QUICKSTART_ROOT)]
        state_root: PathBuf,
        /// The loopback port of the public MCP/HTTP listener.
        #[arg(long, default_value_t = 8470)]
        port: u16,
        /// The loopback port of the executor WebSocket (`agentworks executor connect`);
        /// defaults to the port after --port.
        #[arg(long, value_name = "PORT")]
        gateway_port: Option<u16>,
        /// The chat model's OpenAI-compatible API base, e.g. https://api.example.com/v1
        /// (http:// to a loopback host only); needs --model.
        #[arg(long, value_name = "URL", requires = "model")]
        model_url: Option<String>,
        /// The model name sent with every request; needs --model-url.
        #[arg(long, value_name = "NAME", requires = "model_url")]
        model: Option<String>,
        /// A file holding the model's API key (read when quickstart starts and by agentd for
        /// every request, never printed).
        #[arg(long, value_name = "FILE", requires = "model_url")]
        model_key_file: Option<PathBuf>,
        /// A coding CLI runnerd may run as a chat's agent, as NAME=PATH: the provider's name
        /// is its driver (runnerd has: codex, claude) or, for an agent that speaks ACP, the
        /// agent (opencode: the ACP driver, `opencode acp`, chat completions); PATH its
        /// executable, an absolute or relative path or a bare name found on PATH, e.g.
        /// --provider codex=/usr/local/bin/codex. Repeatable (one per name); needs
        /// --provider-upstream.
        #[arg(
            long = "provider",
            value_name = "NAME=PATH",
            requires = "provider_upstream"
        )]
        providers: Vec<String>,
        /// The model API's base URL the providers' requests go to, through runnerd's model
        /// gateway, e.g. https://api.openai.com/v1 (http:// to a loopback host only); needs
        /// --provider.
        #[arg(long, value_name = "URL", requires = "providers")]
        provider_upstream: Option<String>,
        /// A file holding the upstream's API key (read by runnerd only, never shown to a CLI
        /// or printed); needs --provider.
        #[arg(long, value_name = "FILE", requires = "providers")]
        provider_key_file: Option<PathBuf>,
        /// The model name the providers' CLIs ask for [default: gpt-5.5]; needs --provider.
        #[arg(long, value_name = "NAME", requires = "providers")]
        provider_model: Option<String>,
    },
    /// Show each daemon's health (workspaced, agentd, gatewayd, runnerd, and runnerd's
    /// providers with their executable or why each is unavailable): of the configuration
    /// given, else the system install, else a running quickstart of yours (see agentworksctl
    /// --help).
    Status,
    /// Users: add, list, disable, enable, console password, invites and sign-in links.
    #[command(subcommand)]
    User(UserCmd),
    /// Projects (a folder under the documents root each): add, list.
    #[command(subcommand)]
    Project(ProjectCmd),
    /// Project members and their roles.
    #[command(subcommand)]
    Member(MemberCmd),
    /// Personal access tokens: create (shown once), list, revoke.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Write receipts.
    #[command(subcommand)]
    Receipt(ReceiptCmd),
    /// Laptop logins (`agentworks login`): approve a pending code for a user.
    #[command(subcommand)]
    Login(LoginCmd),
    /// Sign-in apps for MCP servers that offer no dynamic registration (a project's MCP
    /// connections sign in with them): set, show, list, remove.
    #[command(subcommand, name = "mcp-app")]
    McpApp(McpAppCmd),
}

#[derive(Debug, Subcommand)]
pub enum McpAppCmd {
    /// Set (or replace) the app for KEY: `google` (every Google server), `github`, `slack`, or
    /// a server's host name. Register the printed callback URL with the provider.
    Set {
        key: String,
        /// The client id the provider gave.
        #[arg(long)]
        client_id: String,
        /// A file holding the client secret (read once, sealed by agentd, never printed).
        #[arg(long, value_name = "FILE")]
        client_secret_file: Option<PathBuf>,
        /// The provider's OAuth issuer (the `issuer` of its authorization-server metadata, an
        /// https URL): the app is used only with servers whose authorization server is exactly
        /// this one, never with another server under the same domain.
        #[arg(long, value_name = "URL")]
        issuer: String,
    },
    /// Show one app (never its secret).
    Show { key: String },
    /// List the apps.
    List,
    /// Remove an app.
    Remove { key: String },
}

#[derive(Debug, Subcommand)]
pub enum LoginCmd {
    /// Approve the code `agentworks login` printed; the laptop then gets a devices:connect
    /// token for this user (and nothing else).
    Approve {
        /// The code shown by `agentworks login`, e.g. BCDF-GHJK.
        code: String,
        #[arg(long)]
        user: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// Add a user.
    Add { name: String },
    /// List users.
    List,
    /// Disable a user: every token of theirs stops working at once.
    Disable { name: String },
    /// Enable a disabled user.
    Enable { name: String },
    /// Set a user's web console password, read from stdin (one line; 8-1024 characters).
    /// Their console sessions end.
    Passwd { name: String },
    /// Make a one-time web console invite for a user (valid 7 days): the link lets them set
    /// their password and sign in. Printed once.
    Invite { name: String },
    /// Make a one-time web console sign-in link for a user (valid 15 minutes, no password
    /// needed): a new one when the last was used or expired. Printed once.
    SignInLink { name: String },
}

#[derive(Debug, Subcommand)]
pub enum ProjectCmd {
    /// Add a project; its folder is created under the documents root by workspaced.
    Add(ProjectAdd),
    /// List projects.
    List,
}

#[derive(Debug, ClapArgs)]
pub struct ProjectAdd {
    pub name: String,
    /// workflow or code.
    #[arg(long, default_value = "workflow")]
    pub kind: String,
    /// The owning user.
    #[arg(long)]
    pub owner: String,
    /// The folder under the documents root (default: the project's name).
    #[arg(long)]
    pub folder: Option<String>,
    /// Policy WritePaths: folders where authors may write (default: the whole project).
    #[arg(long = "write-path", value_name = "PATH")]
    pub write_paths: Vec<String>,
    /// Policy BlockedPaths: neither readable nor writable.
    #[arg(long = "blocked-path", value_name = "PATH")]
    pub blocked_paths: Vec<String>,
    /// Policy BlockedWritePaths: readable, never writable.
    #[arg(long = "blocked-write-path", value_name = "PATH")]
    pub blocked_write_paths: Vec<String>,
    /// Read-only grants.
    #[arg(long = "read-only-path", value_name = "PATH")]
    pub read_only_paths: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum MemberCmd {
    /// Add a member, or change a member's role.
    Add {
        #[arg(long)]
        project: String,
        #[arg(long)]
        user: String,
        /// owner, co-owner, editor, runner or viewer.
        #[arg(long)]
        role: String,
    },
    /// Remove a member (effective for their next request).
    Remove {
        #[arg(long)]
        project: String,
        #[arg(long)]
        user: String,
    },
    /// List a project's members.
    List {
        #[arg(long)]
        project: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create a token; it is printed once and stored only as a hash.
    Create(TokenCreate),
    /// List tokens (never their secrets).
    List {
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by id (effective for the next request).
    Revoke { id: String },
}

#[derive(Debug, ClapArgs)]
pub struct TokenCreate {
    /// The user the token acts as.
    #[arg(long)]
    pub user: String,
    /// workflows:read, workflows:run, workflows:write, devices:connect (exclusive) or
    /// devices:approve (exclusive: approves laptop logins for the user). Repeat.
    #[arg(long = "scope", required = true)]
    pub scopes: Vec<String>,
    /// Restrict the token to one project.
    #[arg(long)]
    pub project: Option<String>,
    /// Expire after this long: 30d, 12h, 90m.
    #[arg(long, value_name = "DURATION")]
    pub expires_in: Option<String>,
    /// Folder caps: the token may write only beneath these folders. Repeat.
    #[arg(long = "write-folder", value_name = "PATH")]
    pub write_folders: Vec<String>,
    /// Folder caps: these folders are read-only for the token. Repeat.
    #[arg(long = "read-only-folder", value_name = "PATH")]
    pub read_only_folders: Vec<String>,
    /// A label to recognise the token by.
    #[arg(long)]
    pub label: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ReceiptCmd {
    /// Show the receipt of a write, by request id (reconciled if it was left prepared).
    Show {
        request_id: String,
        #[arg(long)]
        project: String,
        /// Whose request id (ids are scoped to the user who sent them).
        #[arg(long)]
        user: String,
    },
}

/// The clap definition of `agentworksctl` (for man pages and completions).
pub fn command() -> clap::Command {
    Cli::command()
}
