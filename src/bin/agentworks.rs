//! `agentworks`, the laptop CLI: `login`, `logout` and `executor connect` (which shares folders
//! with the server over an outbound WebSocket and runs the agent's commands and patches in a
//! Landlock sandbox), plus two hidden modes the executor re-executes itself in: the sandbox
//! launcher (`__sandbox-exec`) and the patch applier (`__apply-patch`).
//!
//! Exit codes:
//! - 0: success (for `executor connect`: sharing ended with Ctrl-C/SIGTERM)
//! - 1: an error (bad grants, refused URL, network or file errors), with a message
//! - 2: bad command-line usage
//! - 3: no credential, or the server no longer accepts it (revoked, 4001; unauthorized,
//!   4003): run `agentworks login` again
//! - 126: the sandbox launcher refused to run a command (hidden mode)

use std::io::BufRead;
use std::process::ExitCode;
use std::sync::Arc;

use agentworks_laptop::cli::{Cli, Command, ExecutorCommand};
use agentworks_laptop::config::{Credentials, Dirs, ensure_private_dir};
use agentworks_laptop::connect::{self, End, Executor, Status};
use agentworks_laptop::grants::{GrantArgs, Grants};
use agentworks_laptop::limits::Limits;
use agentworks_laptop::receipts::Receipts;
use agentworks_laptop::{login, sandbox, shell};
use anyhow::{Context, anyhow};
use clap::Parser;

/// Exit code: the credential is missing or no longer accepted.
const EXIT_RELOGIN: u8 = 3;

fn main() -> ExitCode {
    // Sandbox launcher mode (`agentworks __sandbox-exec <policy-json> -- <sh> -c <command>`):
    // must stay first in main, while the process is single-threaded. It only returns on error,
    // before any command ran.
    if std::env::args().nth(1).as_deref() == Some(agentworks_laptop::sandbox::SUBCOMMAND) {
        let args: Vec<String> = std::env::args().collect();
        let error = agentworks_laptop::sandbox::launcher_main(&args[2..]);
        eprintln!("{}{error}", agentworks_laptop::sandbox::REFUSAL_PREFIX);
        return std::process::ExitCode::from(126);
    }

    // Patch applier mode (`agentworks __apply-patch <folder>`, job on stdin): run by the
    // launcher above, already inside the sandbox.
    if std::env::args().nth(1).as_deref() == Some(agentworks_laptop::patch::SUBCOMMAND) {
        let args: Vec<String> = std::env::args().skip(2).collect();
        let code = agentworks_laptop::patch::apply_main(&args);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }

    let cli = Cli::parse();
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
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentworks: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Variables `executor connect` keeps: the commands' own (see [`shell::kept_env`]), the XDG
/// dirs it needs to find its credential and state, and (debug builds) the Landlock test knob.
fn executor_keeps(key: &std::ffi::OsStr) -> bool {
    shell::kept_env(key)
        || key == "XDG_CONFIG_HOME"
        || key == "XDG_STATE_HOME"
        || (cfg!(debug_assertions) && key == sandbox::TEST_ABI_ENV)
}

/// Keeps the executor's secrets out of reach of the commands it runs, which run as the same
/// person and can read `/proc/<pid>/…` of processes outside their sandbox on kernels where
/// Landlock does not restrict that: the process becomes non-dumpable (its memory, descriptors
/// and environment are no longer open to same-user processes), and when its environment holds
/// anything beyond what it needs (login and provider tokens, agent sockets) it re-executes
/// itself without them, since the initial environment stays readable in
/// `/proc/<pid>/environ` whatever the process later removes. Exits 1 if that fails.
fn protect_executor() {
    use std::os::unix::process::CommandExt;
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("agentworks: cannot make the executor non-dumpable: {e}");
        std::process::exit(1);
    }
    if std::env::vars_os().all(|(key, _)| executor_keeps(&key)) {
        return;
    }
    let error = std::process::Command::new("/proc/self/exe")
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
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "laptop".to_owned())
}

fn relogin(message: &str) -> ExitCode {
    eprintln!("agentworks: {message}\nRun `agentworks login --server URL` again.");
    ExitCode::from(EXIT_RELOGIN)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let dirs = Dirs::from_env()?;
    match cli.command {
        Command::Login {
            server,
            gateway,
            with_token,
            name,
        } => {
            let base = login::server_url(&server)?;
            if let Some(gateway) = &gateway {
                connect::executor_url(Some(gateway), &server)?;
            }
            let token = if with_token {
                let mut line = String::new();
                std::io::stdin()
                    .lock()
                    .read_line(&mut line)
                    .context("cannot read the token from stdin")?;
                let token = line.trim().to_owned();
                if token.is_empty() {
                    return Err(anyhow!("no token on stdin"));
                }
                login::check_token(&base, &token).await?;
                token
            } else {
                let code = login::start(&base, &name.unwrap_or_else(hostname)).await?;
                println!(
                    "To connect this device, have the code {} approved for your account: an operator runs `agentworksctl login approve {} --user YOU`, or you POST it to {} with a devices:approve token of yours",
                    code.user_code, code.user_code, code.verification_uri
                );
                println!("Code: {}", code.user_code);
                println!("Waiting for approval…");
                login::poll(&base, &code).await?
            };
            let stored = Credentials {
                server: base.render(),
                gateway,
                token,
            }
            .store(&dirs)?;
            println!(
                "Logged in; the credential is stored in {}",
                stored.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Chat {
            project,
            chat,
            local,
            device,
            yes,
            server,
            token_file,
        } => {
            let token = match token_file {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read the token file {}", path.display()))?
                    .trim()
                    .to_owned(),
                None => std::env::var("AGENTWORKS_TOKEN").map_err(|_| {
                    anyhow!("set AGENTWORKS_TOKEN (or --token-file) to a personal token with a workflows scope")
                })?,
            };
            let server = match server {
                Some(server) => server,
                None => Credentials::load(&dirs)?
                    .map(|c| c.server)
                    .ok_or_else(|| anyhow!("no server: pass --server URL (or log in first)"))?,
            };
            agentworks_laptop::chat::run(agentworks_laptop::chat::ChatOptions {
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
        Command::Logout => {
            let Some(creds) = Credentials::load(&dirs)? else {
                println!("Not logged in.");
                return Ok(ExitCode::SUCCESS);
            };
            let revoked = match login::server_url(&creds.server) {
                Ok(base) => login::revoke(&base, &creds.token)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            Credentials::delete(&dirs)?;
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
        Command::Executor {
            command:
                ExecutorCommand::Connect {
                    name,
                    folders,
                    write_folders,
                    block,
                    read_only,
                    downloads,
                    allow_unix_sockets,
                    max_processes,
                    max_memory,
                    server,
                    gateway,
                },
        } => {
            let args = GrantArgs {
                folders,
                write_folders,
                block,
                read_only,
                downloads,
            };
            let grants = Grants::validate(&args, &dirs)?;
            print!("{}", grants.permissions_text());
            // Moves the executor into a leaf of its delegated cgroup, when it has one.
            let limits = Limits::setup(max_processes, max_memory, allow_unix_sockets);
            let abi = sandbox::landlock_status();
            print!("{}", limits.text(abi.as_ref().ok().copied()));
            if let Err(e) = abi {
                eprintln!("warning: {e}\nCommands and patches will be refused on this machine.");
            }
            let creds = Credentials::load(&dirs)?;
            let server = server.or_else(|| creds.as_ref().map(|c| c.server.clone()));
            let gateway = gateway.or_else(|| creds.as_ref().and_then(|c| c.gateway.clone()));
            let Some(server) = server.or_else(|| gateway.clone()) else {
                return Ok(relogin("not logged in"));
            };
            let url = connect::executor_url(gateway.as_deref(), &server)?;
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
            let launcher =
                std::env::current_exe().context("cannot find the agentworks executable")?;
            let executor = Arc::new(Executor {
                url,
                token: creds.token,
                device_name: name.unwrap_or_else(hostname),
                grants: Arc::new(grants),
                dirs,
                receipts: Arc::new(receipts),
                launcher,
                limits: Arc::new(limits),
                status: Status::default(),
            });
            let shutdown = tokio_util::sync::CancellationToken::new();
            let signals = shutdown.clone();
            tokio::spawn(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return;
                };
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                signals.cancel();
            });
            let status = executor.status.clone();
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
    }
}
