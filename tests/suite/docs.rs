//! The man pages cannot drift from the parsers: each real binary's `--help` (and each
//! subcommand's) is compared with the man page generated from `agentworks::cli` the way
//! `examples/gen_docs.rs` generates it, and every long flag `--help` lists must be documented
//! as an option there.

use std::path::Path;
use std::process::Command;

/// Every program, its binary and its clap definition.
fn programs() -> Vec<(&'static str, &'static str, clap::Command)> {
    vec![
        (
            "agentworks-workspaced",
            env!("CARGO_BIN_EXE_agentworks-workspaced"),
            agentworks_workspace::cli::command(),
        ),
        (
            "agentworks-agentd",
            env!("CARGO_BIN_EXE_agentworks-agentd"),
            agentworks_agent::cli::command(),
        ),
        (
            "agentworks-gatewayd",
            env!("CARGO_BIN_EXE_agentworks-gatewayd"),
            agentworks_gateway::cli::command(),
        ),
        (
            "agentworksctl",
            env!("CARGO_BIN_EXE_agentworksctl"),
            agentworks_ctl::cli::command(),
        ),
        (
            "agentworks",
            env!("CARGO_BIN_EXE_agentworks"),
            agentworks_laptop::cli::command(),
        ),
    ]
}

/// The long flags listed in the `Options:` section of a `--help` output.
fn long_flags(help: &str) -> Vec<String> {
    let mut flags = Vec::new();
    let mut in_options = false;
    for line in help.lines() {
        if !line.is_empty() && !line.starts_with(' ') {
            in_options = line == "Options:";
            continue;
        }
        let entry = line.trim_start();
        let entry = match entry.split_once(", ") {
            Some((short, rest)) if short.len() == 2 && short.starts_with('-') => rest,
            _ => entry,
        };
        if in_options && let Some(rest) = entry.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.push(name);
        }
    }
    flags
}

/// Every visible subcommand path below `command` (the command itself first, as `[]`).
fn paths(command: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
    out.push(prefix.to_vec());
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let mut path = prefix.to_vec();
        path.push(sub.get_name().to_owned());
        paths(sub, &path, out);
    }
}

#[test]
fn man_pages_document_every_long_flag_of_help() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (name, binary, command) in programs() {
        let man = dir.path().join(name);
        std::fs::create_dir_all(&man).unwrap();
        clap_mangen::generate_to(command.clone(), &man).unwrap();
        let mut all = Vec::new();
        paths(&command, &[], &mut all);
        for path in all {
            let output = Command::new(binary)
                .args(&path)
                .arg("--help")
                .output()
                .unwrap();
            assert!(output.status.success(), "{name} {path:?} --help failed");
            let help = String::from_utf8(output.stdout).unwrap();
            let flags = long_flags(&help);
            assert!(
                flags.iter().any(|f| f == "help"),
                "{name} {path:?}: no flags found in --help:\n{help}"
            );
            let page_name = std::iter::once(name.to_owned())
                .chain(path.iter().cloned())
                .collect::<Vec<_>>()
                .join("-");
            let page = read_page(&man, &page_name);
            for flag in &flags {
                let roff = format!("\\fB\\-\\-{}\\fR", flag.replace('-', "\\-"));
                assert!(
                    page.contains(&roff),
                    "{page_name}.1 does not document --{flag}, which `{name} {} --help` lists",
                    path.join(" ")
                );
                checked += 1;
            }
        }
    }
    // The five programs, the two CLIs' subcommands: far more than a handful of flags.
    assert!(checked > 50, "only {checked} flags checked");
}

fn read_page(dir: &Path, name: &str) -> String {
    let file = dir.join(format!("{name}.1"));
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("no man page {}: {e}", file.display()))
}
