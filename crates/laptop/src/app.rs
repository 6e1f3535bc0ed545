//! What `agentworks` does once its command line is known: one function per subcommand
//! (`login`, `logout`, `chat`, `executor connect`), the executor's self-protection before any
//! thread starts, and the two hidden modes the executor re-executes itself in.
//!
//! Owns: the order of the executor's security steps (hidden modes first while the process is
//! single-threaded, then non-dumpable and a clean environment, only then the runtime's threads)
//! and the exit codes. Never: parses flags (the bin does, with [`crate::cli`]) or runs a command
//! itself (that is [`crate::shell`] through the launcher).
//!
//! Exit codes:
//! - 0: success (for `executor connect`: sharing ended with Ctrl-C/SIGTERM)
//! - 1: an error (bad grants, refused URL, network or file errors), with a message
//! - 2: bad command-line usage (clap, in the bin)
//! - 3: no credential, or the server no longer accepts it (revoked, 4001; unauthorized,
//!   4003): run `agentworks login` again
//! - 126: the sandbox launcher refused to run a command (hidden mode)

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::chat::{ChatError, ChatOptions};
use crate::cli::{Cli, Command, ExecutorCommand};
use crate::config::{ConfigError, Credentials, Dirs, ensure_private_dir};
use crate::connect::{self, ConnectError, End, Executor, Status};
use crate::grants::{GrantArgs, GrantError, Grants};
use crate::login::{self, LoginError};
use crate::receipts::{ReceiptError, Receipts};
use crate::{patch, shell};
use agentworks_core::text::strip_controls;
use agentworks_sandbox::limits::Limits;

/// Exit code: the credential is missing or no longer accepted.
pub const EXIT_RELOGIN: u8 = 3;

/// Why a subcommand failed (exit code 1). Printed with its whole source chain.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Login(#[from] LoginError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Grants(#[from] GrantError),
    #[error(transparent)]
    Receipts(#[from] ReceiptError),
    #[error(transparent)]
    Chat(#[from] ChatError),
    #[error("cannot read the token from stdin")]
    ReadStdinToken(#[source] std::io::Error),
    #[error("no token on stdin")]
    NoStdinToken,
    #[error("cannot read the token file {}", path.display())]
    ReadTokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("set AGENTWORKS_TOKEN (or --token-file) to a personal token with a workflows scope")]
    NoChatToken,
    #[error("no server: pass --server URL (or log in first)")]
    NoServer,
    #[error("cannot find the agentworks executable")]
    NoExecutable(#[source] std::io::Error),
    #[error(
        "agentworks login asks on a terminal whether to use this laptop for the account that \
         approves it; without a terminal, pass --yes to keep the credential without asking"
    )]
    LoginNeedsTerminal,
    #[error("the device name {name:?} is refused: {why}; choose another with --name")]
    DeviceName { name: String, why: String },
    #[error("not logged in: this laptop was not kept for {account}; nothing was stored{revoked}")]
    LoginDeclined { account: String, revoked: String },
    #[error("cannot read the answer from the terminal")]
    ReadAnswer(#[source] std::io::Error),
}

/// The hidden modes, recognised by the first argument: the sandbox launcher
/// (`agentworks __sandbox-exec <policy-json> -- <sh> -c <command>`), its namespace probe
/// (`agentworks __sandbox-probe`) and the patch applier (`agentworks __apply-patch <folder>`,
/// job on stdin). `None` when this is none of them.
///
/// Must be called first in `main`, before the command line is parsed and while the process is
/// single-threaded: the launcher confines the process it is in. It only returns on error,
/// before any command ran.
pub fn hidden_mode() -> Option<ExitCode> {
    // The launcher, and the namespace probe the executor runs at connect (can this machine
    // give a command its own namespaces?).
    if let Some(code) = agentworks_sandbox::launcher::main_if_launcher() {
        return Some(code);
    }
    // Run by the launcher above, already inside the sandbox.
    if std::env::args().nth(1).as_deref() == Some(patch::SUBCOMMAND) {
        let args: Vec<String> = std::env::args().skip(2).collect();
        let code = patch::apply_main(&args);
        return Some(ExitCode::from(u8::try_from(code).unwrap_or(1)));
    }
    None
}

/// Run one parsed command line. `executor connect` protects itself before the runtime (and
/// its threads) start; errors are printed here.
pub fn run(cli: Cli) -> ExitCode {
    if let Command::Executor {
        command: ExecutorCommand::Connect { .. },
    } = &cli.command
    {
        protect_executor();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agentworks: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            // An error may quote what a server sent: no control character of it reaches the
            // terminal.
            eprintln!("agentworks: {}", strip_controls(&with_sources(&e)));
            ExitCode::from(1)
        }
    }
}

/// `error: source: source of source…`, the whole chain on one line.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

async fn dispatch(cli: Cli) -> Result<ExitCode, AppError> {
    let dirs = Dirs::from_env()?;
    match cli.command {
        Command::Login {
            server,
            gateways,
            with_token,
            name,
            yes,
        } => login(&dirs, &server, gateways, with_token, name, yes).await,
        Command::Chat {
            project,
            chat,
            local,
            device,
            yes,
            server,
            token_file,
        } => {
            let token = chat_token(token_file)?;
            let server = match server {
                Some(server) => server,
                None => Credentials::load(&dirs)?
                    .map(|c| c.server)
                    .ok_or(AppError::NoServer)?,
            };
            crate::chat::run(ChatOptions {
                server: login::server_url(&server)?,
                token,
                project,
                chat,
                local,
                device,
                assume_yes: yes,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Logout => logout(&dirs).await,
        Command::Executor {
            command:
                ExecutorCommand::Connect {
                    name,
                    folders,
                    write_folders,
                    block,
                    read_only,
                    // One `true` per --downloads; where each stands is in `downloads_for`.
                    downloads: _,
                    downloads_for,
                    allow_unix_sockets,
                    allow_project_config,
                    max_processes,
                    max_memory,
                    server,
                    gateways,
                },
        } => {
            // The --gateway URLs are checked before the folders and before anything is
            // printed: a refused gateway is reported alone, not after the whole permissions
            // banner. (Given gateways do not depend on the server; stored ones were checked at
            // login.)
            if !gateways.is_empty() {
                connect::executor_urls(&gateways, "")?;
            }
            let args = GrantArgs {
                folders,
                write_folders,
                block,
                read_only,
                downloads: downloads_for,
            };
            let grants = Grants::validate(&args, &dirs)?;
            let creds = Credentials::load(&dirs)?;
            print!("{}", grants.permissions_text());
            if let Some(creds) = &creds {
                println!("{}", shared_with(creds));
            }
            // Moves the executor into a leaf of its delegated cgroup, when it has one.
            let limits = Limits::setup(
                max_processes,
                max_memory,
                allow_unix_sockets,
                crate::limits::EXECUTOR_CGROUPS,
            );
            let target = ConnectTarget {
                name,
                server,
                gateways,
                allow_project_config,
            };
            executor_connect(dirs, creds, grants, limits, target).await
        }
    }
}

/// `agentworks login`: a pasted token (`--with-token`, checked against the server) or the
/// device grant; the credential is stored only once the server accepted it, with the account
/// it serves, which is printed. A device login can be approved by anyone who learns its code,
/// with their own account, so on a terminal the person is asked whether to use this laptop
/// for the account that approved it (no: the token is revoked and nothing is stored); without
/// a terminal it needs `--yes`, and is refused before any code is shown. A pasted token is
/// the person's own choice and stdin carries it, so it is not asked about.
async fn login(
    dirs: &Dirs,
    server: &str,
    gateways: Vec<String>,
    with_token: bool,
    name: Option<String>,
    yes: bool,
) -> Result<ExitCode, AppError> {
    let base = login::server_url(server)?;
    // Every gateway is checked before anything is asked of the server; one bad URL refuses all.
    connect::executor_urls(&gateways, server)?;
    let (token, account) = if with_token {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(AppError::ReadStdinToken)?;
        let token = line.trim().to_owned();
        if token.is_empty() {
            return Err(AppError::NoStdinToken);
        }
        let account = login::account(&base, &token).await?;
        println!(
            "Signed in as {} on {}.",
            strip_controls(&account),
            base.render()
        );
        (token, account)
    } else {
        // Before a code is shown: nobody should approve a login that then cannot be confirmed.
        if !yes && !std::io::stdin().is_terminal() {
            return Err(AppError::LoginNeedsTerminal);
        }
        let device_name = name.unwrap_or_else(hostname);
        agentworks_contract::executor::check_device_name(&device_name).map_err(|why| {
            AppError::DeviceName {
                name: device_name.clone(),
                why,
            }
        })?;
        let code = login::start(&base, &device_name).await?;
        // The links are the server's: shown without their control characters.
        println!(
            "{}",
            strip_controls(&login::instructions(&code, &device_name))
        );
        println!("Waiting for approval…");
        let token = login::poll(&base, &code).await?;
        let account = match login::account(&base, &token).await {
            Ok(account) => account,
            Err(error) => {
                // A token whose account cannot be shown is not kept anywhere.
                let _ = login::revoke(&base, &token).await;
                return Err(error.into());
            }
        };
        println!(
            "Signed in as {} on {}.",
            strip_controls(&account),
            base.render()
        );
        if !yes && !use_laptop_for(&account)? {
            let revoked = match login::revoke(&base, &token).await {
                Ok(()) => ", and the token was revoked on the server".to_owned(),
                Err(e) => format!(
                    "; the token could not be revoked on the server ({e}): ask an operator to revoke it"
                ),
            };
            return Err(AppError::LoginDeclined {
                account: strip_controls(&account).into_owned(),
                revoked,
            });
        }
        (token, account)
    };
    let shown = strip_controls(&account).into_owned();
    let stored = Credentials {
        server: base.render(),
        gateways,
        token,
        account: Some(account),
    }
    .save(dirs)?;
    println!("Logged in as {shown}; the credential is stored in {stored}");
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal whether this laptop is to serve `account`; only `y` or `yes` keeps it.
fn use_laptop_for(account: &str) -> Result<bool, AppError> {
    eprint!("Use this laptop for {}? [y/N] ", strip_controls(account));
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(AppError::ReadAnswer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

/// The line after the permissions text: whose agent the folders are shared with.
fn shared_with(creds: &Credentials) -> String {
    match &creds.account {
        Some(account) => format!(
            "They are shared with the account {} on {}: its agent sends the commands and \
             patches. If that is not your account, press Ctrl-C and run `agentworks logout`.",
            strip_controls(account),
            creds.server
        ),
        None => format!(
            "They are shared with the account that approved this laptop's login on {} (shown \
             once connected).",
            creds.server
        ),
    }
}

/// The personal token `agentworks chat` presents: from `--token-file`, else `AGENTWORKS_TOKEN`.
fn chat_token(token_file: Option<PathBuf>) -> Result<String, AppError> {
    match token_file {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(token) => Ok(token.trim().to_owned()),
            Err(source) => Err(AppError::ReadTokenFile { path, source }),
        },
        None => std::env::var("AGENTWORKS_TOKEN").map_err(|_| AppError::NoChatToken),
    }
}

/// `agentworks logout`: the local credential is deleted whether or not the server could
/// revoke the token; the person is told which.
async fn logout(dirs: &Dirs) -> Result<ExitCode, AppError> {
    let Some(creds) = Credentials::load(dirs)? else {
        println!("Not logged in.");
        return Ok(ExitCode::SUCCESS);
    };
    let revoked = match login::server_url(&creds.server) {
        Ok(base) => login::revoke(&base, &creds.token)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    Credentials::forget(dirs)?;
    println!("Logged out: the local credential was deleted.");
    if revoked.is_ok() {
        println!("The token was revoked on the server.");
    }
    if let Err(reason) = revoked {
        println!(
            "The token could not be revoked on the server ({reason}); ask an operator to revoke it (agentworksctl) if it may have leaked."
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Where `executor connect` dials and as what device, from its flags (the stored credential
/// fills in the rest).
struct ConnectTarget {
    name: Option<String>,
    server: Option<String>,
    /// `--gateway`, repeated, in failover order; empty: the ones stored at login.
    gateways: Vec<String>,
    /// `--allow-project-config`.
    allow_project_config: bool,
}

/// `agentworks executor connect`, once the grants are validated and the limits set up: dial
/// gatewayd with the stored credential and serve until Ctrl-C/SIGTERM or a refusal.
async fn executor_connect(
    dirs: Dirs,
    creds: Option<Credentials>,
    grants: Grants,
    limits: Limits,
    target: ConnectTarget,
) -> Result<ExitCode, AppError> {
    let launcher = std::env::current_exe().map_err(AppError::NoExecutable)?;
    let exclusions = agentworks_sandbox::exclusion_mechanism(
        &agentworks_sandbox::process::Launcher::at(&launcher),
    );
    print!("{}", grants.file_creation_text(&exclusions));
    print!(
        "{}",
        crate::project_config::permissions_text(target.allow_project_config)
    );
    let abi = agentworks_sandbox::check_available();
    print!(
        "{}",
        crate::limits::limits_text(&limits, abi.as_ref().ok().copied().flatten())
    );
    if let Err(e) = abi {
        eprintln!("warning: {e}\nCommands and patches will be refused on this machine.");
    }
    let server = target
        .server
        .or_else(|| creds.as_ref().map(|c| c.server.clone()));
    let gateways = if target.gateways.is_empty() {
        creds
            .as_ref()
            .map(|c| c.gateways.clone())
            .unwrap_or_default()
    } else {
        target.gateways
    };
    let Some(server) = server.or_else(|| gateways.first().cloned()) else {
        return Ok(relogin("not logged in"));
    };
    let gateways = connect::executor_urls(&gateways, &server)?;
    let Some(creds) = creds else {
        return Ok(relogin("not logged in"));
    };
    ensure_private_dir(&dirs.state)?;
    let (receipts, interrupted) = Receipts::open(&dirs.receipts_file())?;
    if interrupted > 0 {
        eprintln!(
            "{interrupted} request(s) were interrupted when the executor last stopped; they will not run again"
        );
    }
    let executor = Arc::new(Executor {
        gateways,
        token: creds.token,
        account: creds.account,
        device_name: target.name.unwrap_or_else(hostname),
        grants: Arc::new(grants),
        dirs,
        receipts: Arc::new(receipts),
        launcher,
        limits: Arc::new(limits),
        exclusions,
        allow_project_config: target.allow_project_config,
        status: Status::default(),
        advertised: Default::default(),
    });
    let status = executor.status.clone();
    // Ctrl-C or SIGTERM ends the sharing.
    let shutdown = agentworks_support::signals::cancel_on_signals(|_| {});
    let end = connect::run(executor, shutdown).await?;
    status.finish();
    match end {
        End::Shutdown => {
            eprintln!("Sharing ended.");
            Ok(ExitCode::SUCCESS)
        }
        End::Unauthorized(message) => Ok(relogin(&message)),
    }
}

/// Variables `executor connect` keeps: the commands' own (see [`shell::kept_env`]), the XDG
/// dirs it needs to find its credential and state, and (debug builds) the Landlock test knob
/// and the crash tests' failpoint (`agentworks_fs::failpoint`), neither passed to commands.
fn executor_keeps(key: &std::ffi::OsStr) -> bool {
    shell::kept_env(key)
        || key == "XDG_CONFIG_HOME"
        || key == "XDG_STATE_HOME"
        || (cfg!(debug_assertions)
            && (key == agentworks_sandbox::TEST_ABI_ENV
                || key == agentworks_sandbox::TEST_NO_USERNS_ENV
                || key == "AGENTWORKS_FAILPOINT"))
}

/// Keeps the executor's secrets out of reach of the commands it runs, which run as the same
/// person and can read `/proc/<pid>/…` of processes outside their sandbox on kernels where
/// Landlock does not restrict that: the process becomes non-dumpable (its memory, descriptors
/// and environment are no longer open to same-user processes), and when its environment holds
/// anything beyond what it needs (login and provider tokens, agent sockets) it re-executes
/// itself without them, since the initial environment stays readable in
/// `/proc/<pid>/environ` whatever the process later removes. Exits 1 if that fails.
///
/// Runs before the runtime starts: the re-exec must happen while the process is
/// single-threaded.
///
/// macOS: no `/proc`, but a same-user process reads another's initial environment with
/// `sysctl(KERN_PROCARGS2)` (`ps eww`), so the re-execution is the same (through the executable's
/// path); its memory is out of same-user reach without a debugging entitlement, so there is no
/// dumpable flag to clear.
fn protect_executor() {
    use std::os::unix::process::CommandExt;
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("agentworks: cannot make the executor non-dumpable: {e}");
        std::process::exit(1);
    }
    if std::env::vars_os().all(|(key, _)| executor_keeps(&key)) {
        return;
    }
    #[cfg(target_os = "linux")]
    let exe = std::path::PathBuf::from("/proc/self/exe");
    #[cfg(target_os = "macos")]
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!(
                "agentworks: cannot find the executable to restart without the environment's secrets: {e}"
            );
            std::process::exit(1);
        }
    };
    let error = std::process::Command::new(exe)
        .arg0(
            std::env::args_os()
                .next()
                .unwrap_or_else(|| "agentworks".into()),
        )
        .args(std::env::args_os().skip(1))
        .env_clear()
        .envs(std::env::vars_os().filter(|(key, _)| executor_keeps(key)))
        .exec();
    eprintln!("agentworks: cannot restart without the environment's secrets: {error}");
    std::process::exit(1);
}

fn hostname() -> String {
    #[cfg(target_os = "linux")]
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok();
    #[cfg(target_os = "macos")]
    let name = {
        let mut buffer = [0u8; 256];
        // SAFETY: gethostname writes at most `len` bytes into the buffer we own; the result is
        // read only up to its first NUL (or the buffer's end).
        let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
        (rc == 0).then(|| {
            let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
            let name = String::from_utf8_lossy(&buffer[..end]);
            name.trim().trim_end_matches(".local").to_owned()
        })
    };
    name.filter(|h| !h.is_empty())
        .unwrap_or_else(|| "laptop".to_owned())
}

/// `message` may be a gateway's close reason: shown without its control characters.
fn relogin(message: &str) -> ExitCode {
    eprintln!(
        "agentworks: {}\nRun `agentworks login --server URL` again.",
        strip_controls(message)
    );
    ExitCode::from(EXIT_RELOGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_printed_with_their_sources() {
        let error = AppError::ReadTokenFile {
            path: PathBuf::from("/nowhere/token"),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
        };
        assert_eq!(
            with_sources(&error),
            "cannot read the token file /nowhere/token: not found"
        );
    }
}
