//! `agentworksctl`: the operator CLI.
//!
//! Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration.

use agentworks::ctl;
use agentworks::daemon::{config::Config, shutdown};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Administer agentworks: start a private stack, check the daemons.
///
/// The daemons are found through the same configuration as they use: --config, else
/// $AGENTWORKS_CONFIG, else /etc/agentworks/agentworks.toml; AGENTWORKS_STATE_ROOT points at
/// another state root (for example a running quickstart's).
#[derive(Debug, Parser)]
#[command(name = "agentworksctl", version)]
struct Args {
    /// The TOML configuration file.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start every daemon in the foreground on a private state root (loopback only, all as
    /// the current user), create a demo project, print how to use it; Ctrl-C stops them all.
    Quickstart {
        /// The private state root; reused when run again.
        #[arg(long, value_name = "DIR", default_value = ".agentworks-quickstart")]
        state_root: PathBuf,
    },
    /// Show each daemon's health.
    Status,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentworksctl: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        match args.command {
            Cmd::Quickstart { state_root } => quickstart(state_root, args.json).await,
            Cmd::Status => status(args.config, args.json).await,
        }
    })
}

async fn quickstart(state_root: PathBuf, json: bool) -> ExitCode {
    let shutdown = shutdown::on_signals();
    let result = ctl::quickstart::run(&state_root, shutdown, |started| {
        if json {
            println!("{}", serde_json::to_string(started).unwrap_or_default());
        } else {
            let socket = started.workspaced_socket.display();
            println!("agentworks quickstart is running (Ctrl-C stops it)");
            println!("  state root:      {}", started.state_root.display());
            println!("  documents root:  {}", started.documents_root.display());
            println!("  workspaced:      {socket}");
            println!("  demo project:    {}", started.project);
            println!();
            println!("Try it:");
            println!("  curl --unix-socket {socket} http://_/v1/health");
            println!(
                "  curl --unix-socket {socket} http://_/v1/read -d '{{\"context\":{{\"project\":\"demo\",\"principal\":{{\"user_id\":\"u1\",\"user_name\":\"demo\",\"source\":\"curl\"}},\"guard\":{{\"write_paths\":[\".\"]}}}},\"path\":\"README.md\"}}'"
            );
            println!();
            println!(
                "Administer it from another shell with AGENTWORKS_STATE_ROOT={} agentworksctl status",
                started.state_root.display()
            );
        }
    })
    .await;
    match result {
        Ok(()) => {
            if !json {
                println!("stopped");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentworksctl quickstart: {e}");
            ExitCode::from(1)
        }
    }
}

async fn status(config: Option<PathBuf>, json: bool) -> ExitCode {
    let config = match Config::load(config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            return ExitCode::from(2);
        }
    };
    let report = ctl::status(&config).await;
    if json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        for d in &report {
            let mark = if d.healthy { "ok  " } else { "DOWN" };
            println!("{mark} {:<24} {}  ({})", d.daemon, d.socket, d.detail);
        }
    }
    if report.iter().all(|d| d.healthy) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
