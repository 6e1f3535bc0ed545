//! The command line of `agentworks`, the laptop CLI. Its hidden modes (`__sandbox-exec`,
//! `__apply-patch`) are dispatched by hand before clap and are not part of it.
//!
//! [`parse`] is how the binary reads it: clap's parse, then the one thing clap's derive cannot
//! say, where each `--downloads` stands (it links `~/Downloads` to the folder before it).

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "agentworks",
    version,
    about = "Share folders of this machine with an agentworks server's agent",
    long_about = "Share folders of this machine with an agentworks server's agent.\n\n\
        1. agentworks login --server https://agents.example.com\n\
        2. agentworks executor connect --write-folder ~/src/project\n\n\
        The credential is kept in $XDG_CONFIG_HOME/agentworks/credentials.json (default \
        ~/.config), private state (receipts) in $XDG_STATE_HOME/agentworks (default \
        ~/.local/state)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Sign in with the device grant (or a token on stdin) and store a devices:connect credential.
    Login {
        // The help is an attribute rather than a doc comment: rustdoc would read the example
        // URL as a bare link, and `<…>` or backticks would show in `--help`.
        #[arg(
            long,
            help = "agentd's public URL, e.g. https://agents.example.com (http:// only to loopback)"
        )]
        server: String,
        /// A gateway's WebSocket URL (wss://…; ws:// only to loopback). Repeat it to store
        /// several: `executor connect` dials them in the order given and fails over to the next
        /// when one is lost or cannot be reached. Default: the server's host on port 8471, ws
        /// for an http server and wss for an https one.
        #[arg(long = "gateway", value_name = "URL")]
        gateways: Vec<String>,
        /// Read a devices:connect token from stdin instead of the device grant; it is checked
        /// against the server before it is stored.
        #[arg(long)]
        with_token: bool,
        /// The name shown for this device when the login is approved (default: the hostname).
        #[arg(long)]
        name: Option<String>,
        /// Keep the credential without asking: the device login asks on a terminal whether to
        /// use this laptop for the account that approved it, and refuses without a terminal
        /// unless this is given (for scripts). The account is printed either way.
        #[arg(long)]
        yes: bool,
    },
    /// Delete the stored credential (and try to revoke it on the server).
    Logout,
    /// The laptop executor.
    Executor {
        #[command(subcommand)]
        command: ExecutorCommand,
    },
    /// Chat with the server-side agent in a project, one message per line (/unbind, /quit).
    ///
    /// Needs a personal token with a workflows scope in $AGENTWORKS_TOKEN or --token-file (the
    /// laptop's devices:connect credential cannot chat). With --local ALIAS the chat is bound
    /// to this person's shared laptop folder of that name, after showing the consequences.
    /// Ctrl-C during a turn cancels it on the server (a command running on the laptop is
    /// killed); Ctrl-C at the prompt ends the chat.
    Chat {
        /// The project (name or id).
        #[arg(long)]
        project: String,
        /// Resume this chat instead of creating one (its earlier turns are shown first).
        #[arg(long)]
        chat: Option<String>,
        /// Bind the chat to the shared folder with this alias (see `agentworks executor connect`).
        #[arg(long, value_name = "FOLDER_ALIAS")]
        local: Option<String>,
        /// The device sharing the folder, when several do: its name, or its id when devices of
        /// one name (different credentials) share it.
        #[arg(long)]
        device: Option<String>,
        /// Confirm the binding's consequences without asking.
        #[arg(long)]
        yes: bool,
        /// agentd's URL (default: the one stored at login).
        #[arg(long)]
        server: Option<String>,
        /// A file holding the personal token (default: $AGENTWORKS_TOKEN).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum ExecutorCommand {
    /// Share folders with the server until Ctrl-C.
    ///
    /// Commands run in a Landlock sandbox with open network access; file contents and command
    /// output go to the server and its model. The home directory, its parents, / and folders
    /// holding the CLI's credentials or state are refused.
    Connect {
        /// This device's name as the server shows it (default: the hostname).
        #[arg(long)]
        name: Option<String>,
        /// Share a folder read-only: the agent can read files and run commands in a read-only
        /// sandbox; no patches. Repeatable.
        #[arg(long = "folder", value_name = "PATH")]
        folders: Vec<PathBuf>,
        /// Share a folder read-write: patches, and commands that change files (builds, tests).
        /// Repeatable.
        #[arg(long = "write-folder", value_name = "PATH")]
        write_folders: Vec<PathBuf>,
        /// A path inside a shared folder that commands and patches can neither read nor write.
        /// Repeatable.
        #[arg(long, value_name = "PATH")]
        block: Vec<PathBuf>,
        /// A path inside a write folder that stays read-only. Repeatable.
        #[arg(long = "read-only", value_name = "PATH")]
        read_only: Vec<PathBuf>,
        /// Also share ~/Downloads read-write with the commands and patches of the folder this
        /// follows (--folder or --write-folder), as $AGENTWORKS_DOWNLOADS; other folders get no
        /// Downloads. Repeat it after each folder that needs it.
        #[arg(long, action = clap::ArgAction::Append, num_args = 0,
              default_missing_value = "true", value_parser = clap::value_parser!(bool))]
        downloads: Vec<bool>,
        /// The folders (as given) that a --downloads follows; filled in by [`parse`].
        #[arg(skip)]
        downloads_for: Vec<PathBuf>,
        /// Let commands use Unix sockets: they can then reach local services over Unix
        /// sockets, such as ssh-agent, D-Bus and docker.sock (and, where the agentworks daemons
        /// run as you, their operator sockets). Without it, creating a Unix socket is refused
        /// (or, on Landlock ABI 9+, connecting to one outside the shared folders).
        #[arg(long)]
        allow_unix_sockets: bool,
        /// Let commands change the project config that makes your own tools run programs: the
        /// git config keys that name one (core.fsmonitor, core.hooksPath, aliases starting with
        /// !, include.path, …) and the git hooks, .envrc, .vscode/tasks.json and settings.json,
        /// .mcp.json and the coding CLIs' .claude/, .codex/, .gemini/ and .cursor/. Without
        /// it, every such change a command makes is undone when the command ends, and the
        /// result says so; patches are refused there.
        #[arg(long)]
        allow_project_config: bool,
        /// How many processes a command may start. RLIMIT_NPROC counts all of your user's
        /// processes (threads, in fact), so each command's limit is your user's count when it
        /// starts plus N: a command can start about N more, fewer if your other programs start
        /// more meanwhile. It does not bind root. In a delegated cgroup the command also gets
        /// pids.max = N, its own exact limit.
        #[arg(long, value_name = "N", default_value_t = agentworks_sandbox::limits::DEFAULT_MAX_PROCESSES,
              value_parser = agentworks_sandbox::limits::parse_count)]
        max_processes: u64,
        /// The memory a command may use (memory.max of its cgroup), e.g. 4G or 512M; default:
        /// half of this machine's memory. Needs a delegated cgroup with the memory controller,
        /// e.g. `systemd-run --user --scope -p Delegate=yes agentworks executor connect …`;
        /// without one, commands run with no memory limit and connect says so.
        #[arg(long, value_name = "SIZE", value_parser = agentworks_sandbox::limits::parse_size)]
        max_memory: Option<u64>,
        /// agentd's URL (default: the one stored at login); the gateway defaults to its host on
        /// port 8471.
        #[arg(long)]
        server: Option<String>,
        /// A gateway's WebSocket URL: wss://, or ws:// to loopback only. Repeatable: the
        /// gateways are dialled in the order given; when the session is lost (or a dial fails)
        /// the next one is tried at once, and only after every one of them failed does the
        /// executor wait (1 s, doubling to 30 s) before the next round. A refused credential
        /// ends sharing whichever gateway refused it. Default: the ones stored at login, else
        /// the server's host on port 8471.
        #[arg(long = "gateway", value_name = "URL")]
        gateways: Vec<String>,
    },
}

/// The clap definition of `agentworks` (for man pages and completions).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The command line of this process, parsed; exits with clap's usage error (code 2) when it
/// is wrong, including a `--downloads` that follows no folder.
pub fn parse() -> Cli {
    parse_from(std::env::args_os())
}

/// [`parse`] of `args` (the program name first).
pub fn parse_from<I, T>(args: I) -> Cli
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().get_matches_from(args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let connect = matches
        .subcommand_matches("executor")
        .and_then(|m| m.subcommand_matches("connect"));
    if let (
        Command::Executor {
            command: ExecutorCommand::Connect { downloads_for, .. },
        },
        Some(connect),
    ) = (&mut cli.command, connect)
    {
        *downloads_for = downloads_followed(connect).unwrap_or_else(|message| {
            Cli::command()
                .error(clap::error::ErrorKind::ArgumentConflict, message)
                .exit()
        });
    }
    cli
}

/// The folder each `--downloads` of `executor connect` follows: the `--folder` or
/// `--write-folder` given last before it. One before any folder is an error.
fn downloads_followed(connect: &ArgMatches) -> Result<Vec<PathBuf>, String> {
    let mut folders: Vec<(usize, PathBuf)> = Vec::new();
    for id in ["folders", "write_folders"] {
        if let (Some(indices), Some(values)) =
            (connect.indices_of(id), connect.get_many::<PathBuf>(id))
        {
            folders.extend(indices.zip(values.cloned()));
        }
    }
    let mut linked: Vec<PathBuf> = Vec::new();
    for at in connect.indices_of("downloads").into_iter().flatten() {
        let Some((_, folder)) = folders
            .iter()
            .filter(|(index, _)| *index < at)
            .max_by_key(|(index, _)| *index)
        else {
            return Err(
                "--downloads must follow the --folder or --write-folder whose commands may use \
                 ~/Downloads (e.g. --write-folder ~/src/site --downloads)"
                    .to_owned(),
            );
        };
        if !linked.contains(folder) {
            linked.push(folder.clone());
        }
    }
    Ok(linked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linked(args: &[&str]) -> Result<Vec<PathBuf>, String> {
        let mut all = vec!["agentworks", "executor", "connect"];
        all.extend(args);
        let matches = Cli::command().try_get_matches_from(all).expect("parses");
        let connect = matches
            .subcommand_matches("executor")
            .and_then(|m| m.subcommand_matches("connect"))
            .expect("connect");
        downloads_followed(connect)
    }

    #[test]
    fn downloads_links_the_folder_it_follows() {
        assert_eq!(
            linked(&["--folder", "a", "--write-folder", "b", "--downloads"]),
            Ok(vec![PathBuf::from("b")])
        );
        assert_eq!(
            linked(&["--folder", "a", "--downloads", "--write-folder", "b"]),
            Ok(vec![PathBuf::from("a")])
        );
        // The console's command: the folder, its exclusions, then --downloads.
        assert_eq!(
            linked(&["--write-folder", "b", "--block", "b/.env", "--downloads"]),
            Ok(vec![PathBuf::from("b")])
        );
        assert_eq!(
            linked(&[
                "--folder",
                "a",
                "--downloads",
                "--write-folder=b",
                "--downloads"
            ]),
            Ok(vec![PathBuf::from("a"), PathBuf::from("b")])
        );
        assert_eq!(linked(&["--folder", "a"]), Ok(vec![]));
        assert!(linked(&["--downloads", "--folder", "a"]).is_err());
    }
}
