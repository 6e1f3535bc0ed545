//! Generates the man pages and shell completions from the programs' clap definitions
//! (each program's `cli` module in its crate), so they cannot drift from the parsers.
//!
//! ```text
//! cargo run --example gen_docs -- <out dir>
//! ```
//!
//! writes `<out dir>/man/<program>.1` for every program (plus `<program>-<subcommand>.1` pages
//! for `agentworksctl` and `agentworks`) and `<out dir>/completions/<program>.{bash,zsh,fish}`
//! for the two CLIs. The packages install them (debian/rules, rpm/agentworks.spec).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap_complete::Shell;

/// Every program and its clap definition.
fn programs() -> [(&'static str, clap::Command); 6] {
    [
        (
            "agentworks-workspaced",
            agentworks_workspace::cli::command(),
        ),
        ("agentworks-agentd", agentworks_agent::cli::command()),
        ("agentworks-gatewayd", agentworks_gateway::cli::command()),
        ("agentworks-runnerd", agentworks_runner::cli::command()),
        ("agentworksctl", agentworks_ctl::cli::command()),
        ("agentworks", agentworks_laptop::cli::command()),
    ]
}

/// The programs that get shell completions: the two CLIs.
const COMPLETED: [&str; 2] = ["agentworksctl", "agentworks"];

fn generate(out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    for (name, command) in programs() {
        clap_mangen::generate_to(command.clone(), &man)?;
        if !COMPLETED.contains(&name) {
            continue;
        }
        for (shell, extension) in [
            (Shell::Bash, "bash"),
            (Shell::Zsh, "zsh"),
            (Shell::Fish, "fish"),
        ] {
            let path = completions.join(format!("{name}.{extension}"));
            let mut file = std::fs::File::create(&path)?;
            clap_complete::generate(shell, &mut command.clone(), name, &mut file);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: gen_docs <out dir>");
        return ExitCode::from(2);
    };
    let out = PathBuf::from(out);
    match generate(&out) {
        Ok(()) => {
            println!(
                "wrote {}/man and {}/completions",
                out.display(),
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen_docs: {}: {e}", out.display());
            ExitCode::from(1)
        }
    }
}
