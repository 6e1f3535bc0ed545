//! `agentworksctl`: the operator CLI.
//!
//! Parses flags and calls `agentworks_ctl`. Exit codes: 0 success, 1 the operation failed
//! (refused by a daemon, or a daemon unreachable), 2 bad usage or configuration.

use agentworks_ctl::cli::{
    Cli, Cmd, LoginCmd, MemberCmd, ProjectCmd, ReceiptCmd, TokenCmd, UserCmd,
};
use agentworks_ctl::{self as ctl, admin::CtlError};
use agentworks_daemon::{config::Config, shutdown};
use clap::Parser;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    runtime.block_on(dispatch(cli))
}

async fn dispatch(cli: Cli) -> ExitCode {
    if let Cmd::Quickstart {
        state_root,
        port,
        gateway_port,
    } = cli.command
    {
        let ports = match ctl::quickstart::Ports::new(port, gateway_port) {
            Ok(ports) => ports,
            Err(e) => {
                eprintln!("agentworksctl quickstart: {e}");
                return ExitCode::from(2);
            }
        };
        return quickstart(state_root, ports, cli.json).await;
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            return ExitCode::from(2);
        }
    };
    if let Cmd::Status = cli.command {
        return status(&config, cli.json).await;
    }
    let (endpoint, body) = match request(cli.command) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            return ExitCode::from(2);
        }
    };
    match ctl::admin::call(&config, endpoint, &body).await {
        Ok(answer) => {
            if cli.json {
                println!("{answer}");
            } else {
                print_text(endpoint, &answer);
            }
            ExitCode::SUCCESS
        }
        Err(e @ CtlError::Usage(_)) => {
            eprintln!("agentworksctl: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            if let (
                true,
                CtlError::Refused {
                    code,
                    message,
                    details,
                },
            ) = (cli.json, &e)
            {
                let mut error = details.clone();
                error.insert("code".into(), json!(code));
                error.insert("message".into(), json!(message));
                println!("{}", json!({ "error": error }));
            }
            eprintln!("agentworksctl: {e}");
            ExitCode::from(1)
        }
    }
}

/// Parse and validate a command into an operator endpoint and its body (phase one: nothing
/// is sent until everything checks out).
fn request(command: Cmd) -> Result<(&'static str, Value), CtlError> {
    let role = |raw: &str| -> Result<String, CtlError> {
        agentworks_agent::identity::Role::parse(raw)
            .map(|r| r.as_str().to_owned())
            .ok_or_else(|| {
                CtlError::Usage(format!(
                    "{raw:?} is not a role: owner, co-owner, editor, runner or viewer"
                ))
            })
    };
    Ok(match command {
        Cmd::User(UserCmd::Add { name }) => ("users/add", json!({ "name": name })),
        Cmd::User(UserCmd::List) => ("users/list", json!({})),
        Cmd::User(UserCmd::Disable { name }) => ("users/disable", json!({ "name": name })),
        Cmd::User(UserCmd::Enable { name }) => ("users/enable", json!({ "name": name })),
        Cmd::Project(ProjectCmd::Add(p)) => {
            if agentworks_agent::identity::ProjectKind::parse(&p.kind).is_none() {
                return Err(CtlError::Usage(format!(
                    "--kind {:?}: use workflow or code",
                    p.kind
                )));
            }
            let write_paths = if p.write_paths.is_empty() {
                vec![".".to_string()]
            } else {
                p.write_paths
            };
            (
                "projects/add",
                json!({
                    "name": p.name, "kind": p.kind, "owner": p.owner, "folder": p.folder,
                    "policy": {
                        "write_paths": write_paths, "blocked_paths": p.blocked_paths,
                        "blocked_write_paths": p.blocked_write_paths, "read_only_paths": p.read_only_paths,
                    }
                }),
            )
        }
        Cmd::Project(ProjectCmd::List) => ("projects/list", json!({})),
        Cmd::Member(MemberCmd::Add {
            project,
            user,
            role: r,
        }) => (
            "members/add",
            json!({ "project": project, "user": user, "role": role(&r)? }),
        ),
        Cmd::Member(MemberCmd::Remove { project, user }) => (
            "members/remove",
            json!({ "project": project, "user": user }),
        ),
        Cmd::Member(MemberCmd::List { project }) => ("members/list", json!({ "project": project })),
        Cmd::Token(TokenCmd::Create(t)) => {
            for scope in &t.scopes {
                if agentworks_agent::identity::Scope::parse(scope).is_none() {
                    return Err(CtlError::Usage(format!(
                        "--scope {scope:?}: use workflows:read, workflows:run, workflows:write, devices:connect or devices:approve"
                    )));
                }
            }
            let expires_at_ms = match &t.expires_in {
                Some(d) => {
                    Some(agentworks_support::clock::now_ms() + ctl::admin::parse_duration_ms(d)?)
                }
                None => None,
            };
            let write_folders = (!t.write_folders.is_empty()).then_some(t.write_folders);
            (
                "tokens/create",
                json!({
                    "user": t.user, "scopes": t.scopes, "project": t.project, "label": t.label,
                    "expires_at_ms": expires_at_ms, "write_folders": write_folders,
                    "read_only_folders": t.read_only_folders,
                }),
            )
        }
        Cmd::Token(TokenCmd::List { user }) => ("tokens/list", json!({ "user": user })),
        Cmd::Token(TokenCmd::Revoke { id }) => ("tokens/revoke", json!({ "id": id })),
        Cmd::Receipt(ReceiptCmd::Show {
            request_id,
            project,
            user,
        }) => (
            "receipts/show",
            json!({ "project": project, "request_id": request_id, "user": user }),
        ),
        Cmd::Login(LoginCmd::Approve { code, user }) => {
            ("login/approve", json!({ "user_code": code, "user": user }))
        }
        Cmd::Quickstart { .. } | Cmd::Status => {
            return Err(CtlError::Usage("handled elsewhere".into()));
        }
    })
}

fn print_text(endpoint: &str, answer: &Value) {
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    match endpoint {
        "tokens/create" => {
            println!(
                "token {} for {} ({})",
                s(&answer["info"]["id"]),
                s(&answer["info"]["user_name"]),
                answer["info"]["scopes"]
                    .as_array()
                    .map(|a| a.iter().map(&s).collect::<Vec<_>>().join(" "))
                    .unwrap_or_default()
            );
            println!("{}", s(&answer["token"]));
            println!("(shown once: store it now; only its hash is kept)");
        }
        "users/list" | "projects/list" | "members/list" | "tokens/list" => {
            for row in answer.as_array().into_iter().flatten() {
                let line = match endpoint {
                    "users/list" => format!(
                        "{:<24} {}{}",
                        s(&row["name"]),
                        s(&row["id"]),
                        if row["disabled"] == true {
                            "  (disabled)"
                        } else {
                            ""
                        }
                    ),
                    "projects/list" => format!(
                        "{:<24} {:<9} folder={} id={}",
                        s(&row["name"]),
                        s(&row["kind"]),
                        s(&row["folder"]),
                        s(&row["id"])
                    ),
                    "members/list" => format!("{:<24} {}", s(&row["user"]), s(&row["role"])),
                    _ => format!(
                        "{}  {:<16} {:<40} {}{}",
                        s(&row["id"]),
                        s(&row["user_name"]),
                        row["scopes"]
                            .as_array()
                            .map(|a| a.iter().map(&s).collect::<Vec<_>>().join(","))
                            .unwrap_or_default(),
                        s(&row["label"]),
                        if row["revoked_at_ms"].is_null() {
                            ""
                        } else {
                            "  (revoked)"
                        }
                    ),
                };
                println!("{line}");
            }
        }
        _ => println!(
            "{}",
            serde_json::to_string_pretty(answer).unwrap_or_default()
        ),
    }
}

async fn quickstart(
    state_root: PathBuf,
    ports: ctl::quickstart::Ports,
    json_output: bool,
) -> ExitCode {
    let shutdown = shutdown::on_signals();
    let result = ctl::quickstart::run(&state_root, ports, shutdown, |started| {
        if json_output {
            println!("{}", serde_json::to_string(started).unwrap_or_default());
        } else {
            ctl::quickstart::print_human(started);
        }
    })
    .await;
    match result {
        Ok(()) => {
            if !json_output {
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

async fn status(config: &Config, json_output: bool) -> ExitCode {
    let report = ctl::status(config).await;
    if json_output {
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
