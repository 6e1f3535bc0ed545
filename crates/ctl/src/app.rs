//! What `agentworksctl` does once its command line is known: `quickstart`, `status`, and each
//! operator command as one request to agentd (built and validated before anything is sent),
//! its answer printed as text or JSON.
//!
//! Owns the exit codes: 0 success, 1 the operation failed (refused by a daemon, or a daemon
//! unreachable), 2 bad usage or configuration. Never: parses flags (the bin does, with
//! [`crate::cli`]) or opens a daemon's state directory.

use std::path::PathBuf;
use std::process::ExitCode;

use agentworks_contract::agentd::{
    ApproveLoginRequest, CreateTokenRequest, MemberRequest, ProjectKind, ProjectRequest,
    ReceiptShowRequest, RevokeRequest, Role, Scope, UserRequest,
};
use agentworks_core::guard::Guard;
use agentworks_daemon::{config::Config, shutdown};
use serde::Serialize;
use serde_json::{Value, json};

use crate::admin::{self, CtlError};
use crate::cli::{
    Cli, Cmd, LoginCmd, McpAppCmd, MemberCmd, ProjectAdd, ProjectCmd, ReceiptCmd, TokenCmd,
    TokenCreate, UserCmd,
};
use crate::deployment::{self, Chosen, Settled};
use crate::quickstart::{self, ModelFlags, Ports, ProviderFlags};

/// Run one parsed command line on a fresh runtime.
pub fn run(cli: Cli) -> ExitCode {
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
        model_url,
        model,
        model_key_file,
        providers,
        provider_upstream,
        provider_key_file,
        provider_model,
    } = cli.command
    {
        let ports = match Ports::new(port, gateway_port) {
            Ok(ports) => ports,
            Err(e) => {
                eprintln!("agentworksctl quickstart: {e}");
                return ExitCode::from(2);
            }
        };
        // clap makes --model-url and --model come together.
        let model = model_url.zip(model).map(|(base_url, model)| ModelFlags {
            base_url,
            model,
            key_file: model_key_file,
        });
        // clap makes --provider and --provider-upstream come together.
        let providers = provider_upstream.map(|upstream| ProviderFlags {
            providers,
            upstream,
            key_file: provider_key_file,
            model: provider_model,
        });
        let options = quickstart::Options {
            ports,
            config: cli.config,
            model,
            providers,
        };
        return run_quickstart(state_root, options, cli.json).await;
    }
    let Settled {
        config,
        chosen,
        note,
    } = match deployment::settle(cli.config.as_deref()) {
        Ok(settled) => settled,
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(note) = note {
        eprintln!("agentworksctl: {note}");
    }
    if let Cmd::Status = cli.command {
        return status(&config, &chosen, cli.json).await;
    }
    if let Cmd::McpApp(command) = &cli.command {
        return mcp_app(&config, command, cli.json).await;
    }
    match &cli.command {
        Cmd::User(UserCmd::Passwd { name }) => return user_passwd(&config, name, cli.json).await,
        Cmd::User(UserCmd::Invite { name }) => {
            return user_link(&config, name, ConsoleLinkKind::Invite, cli.json).await;
        }
        Cmd::User(UserCmd::SignInLink { name }) => {
            return user_link(&config, name, ConsoleLinkKind::SignIn, cli.json).await;
        }
        _ => {}
    }
    let (endpoint, body) = match request(cli.command) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            return ExitCode::from(2);
        }
    };
    operator_call(&config, endpoint, &body, cli.json).await
}

/// Send one operator request and print its answer (or refusal).
async fn operator_call(config: &Config, endpoint: &str, body: &Value, json: bool) -> ExitCode {
    match admin::call(config, endpoint, body).await {
        Ok(answer) => {
            if json {
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
            ) = (json, &e)
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
///
/// The bodies are agentd's typed requests where serializing one gives the very JSON sent
/// before; the list and `members/remove` bodies stay literal, because the typed
/// [`agentworks_contract::agentd::ListRequest`] and [`MemberRequest`] would add `null` fields.
fn request(command: Cmd) -> Result<(&'static str, Value), CtlError> {
    Ok(match command {
        Cmd::User(UserCmd::Add { name }) => ("users/add", body(UserRequest { name })?),
        Cmd::User(UserCmd::List) => ("users/list", json!({})),
        Cmd::User(UserCmd::Disable { name }) => ("users/disable", body(UserRequest { name })?),
        Cmd::User(UserCmd::Enable { name }) => ("users/enable", body(UserRequest { name })?),
        Cmd::Project(ProjectCmd::Add(p)) => ("projects/add", project_add(p)?),
        Cmd::Project(ProjectCmd::List) => ("projects/list", json!({})),
        Cmd::Member(MemberCmd::Add {
            project,
            user,
            role: r,
        }) => (
            "members/add",
            body(MemberRequest {
                project,
                user,
                role: Some(role(&r)?),
            })?,
        ),
        Cmd::Member(MemberCmd::Remove { project, user }) => (
            "members/remove",
            json!({ "project": project, "user": user }),
        ),
        Cmd::Member(MemberCmd::List { project }) => ("members/list", json!({ "project": project })),
        Cmd::Token(TokenCmd::Create(t)) => ("tokens/create", token_create(t)?),
        Cmd::Token(TokenCmd::List { user }) => ("tokens/list", json!({ "user": user })),
        Cmd::Token(TokenCmd::Revoke { id }) => ("tokens/revoke", body(RevokeRequest { id })?),
        Cmd::Receipt(ReceiptCmd::Show {
            request_id,
            project,
            user,
        }) => (
            "receipts/show",
            body(ReceiptShowRequest {
                project,
                request_id,
                user,
            })?,
        ),
        Cmd::Login(LoginCmd::Approve { code, user }) => (
            "login/approve",
            body(ApproveLoginRequest {
                user_code: code,
                user,
            })?,
        ),
        Cmd::Quickstart { .. }
        | Cmd::Status
        | Cmd::McpApp(_)
        | Cmd::User(UserCmd::Passwd { .. } | UserCmd::Invite { .. } | UserCmd::SignInLink { .. }) =>
        {
            return Err(CtlError::Usage("handled elsewhere".into()));
        }
    })
}

/// `mcp-app set|show|list|remove`: the operator's MCP sign-in apps (agentd's `mcp-apps`).
async fn mcp_app(config: &Config, command: &McpAppCmd, json_output: bool) -> ExitCode {
    let print_app = |app: &Value| {
        let issuer = match app["issuer"].as_str() {
            Some(issuer) => format!("pinned to the issuer {issuer}"),
            None => "pinned to no issuer, so never used: set it again with --issuer".to_owned(),
        };
        println!(
            "{}: client id {}, {}, {issuer}; callback URL {}",
            text(&app["key"]),
            text(&app["client_id"]),
            if app["has_secret"] == true {
                "with a secret"
            } else {
                "no secret (a public client)"
            },
            text(&app["callback_url"])
        );
    };
    let key_path = |key: &str| -> Result<String, CtlError> {
        if key.is_empty() || key.contains('/') || key.chars().any(char::is_control) {
            return Err(CtlError::Usage(format!("{key:?} is not an app key")));
        }
        Ok(format!("mcp-apps/{key}"))
    };
    let result = match command {
        McpAppCmd::Set {
            key,
            client_id,
            client_secret_file,
            issuer,
        } => {
            let secret = match client_secret_file {
                None => Ok(None),
                Some(file) => std::fs::read_to_string(file)
                    .map(|s| Some(s.trim_end_matches(['\r', '\n']).to_owned()))
                    .map_err(|e| CtlError::Usage(format!("cannot read {}: {e}", file.display()))),
            };
            match (secret, key_path(key)) {
                (Ok(secret), Ok(path)) => {
                    let body =
                        json!({"client_id": client_id, "client_secret": secret, "issuer": issuer});
                    admin::call_resource(config, "PUT", &path, Some(&body)).await
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        McpAppCmd::Show { key } => match key_path(key) {
            Ok(path) => admin::call_resource(config, "GET", &path, None).await,
            Err(e) => Err(e),
        },
        McpAppCmd::List => admin::call_resource(config, "GET", "mcp-apps", None).await,
        McpAppCmd::Remove { key } => match key_path(key) {
            Ok(path) => admin::call_resource(config, "DELETE", &path, None).await,
            Err(e) => Err(e),
        },
    };
    finish(result, json_output, |answer| match command {
        McpAppCmd::List => {
            let apps = answer["apps"].as_array().cloned().unwrap_or_default();
            if apps.is_empty() {
                println!("no MCP sign-in apps");
            }
            for app in &apps {
                print_app(app);
            }
        }
        McpAppCmd::Remove { key } => println!("removed the MCP sign-in app {key}"),
        _ => print_app(answer),
    })
}

/// `user passwd NAME`: the password is the first line of stdin (without its line end).
async fn user_passwd(config: &Config, name: &str, json_output: bool) -> ExitCode {
    let mut line = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut line) {
        eprintln!("agentworksctl: cannot read the password from stdin: {e}");
        return ExitCode::from(2);
    }
    let password = line.strip_suffix('\n').unwrap_or(&line);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.is_empty() {
        eprintln!("agentworksctl: give the password on stdin (one line)");
        return ExitCode::from(2);
    }
    let result = admin::set_password(config, name, password).await;
    finish(result, json_output, |_| {
        println!("password set for {name}; their console sessions were ended")
    })
}

/// Which one-time console link `user invite` or `user sign-in-link` makes.
#[derive(Debug, Clone, Copy)]
enum ConsoleLinkKind {
    /// Sets the person's password, then signs them in (7 days).
    Invite,
    /// Signs the person in, no password needed (15 minutes).
    SignIn,
}

/// `user invite NAME` and `user sign-in-link NAME`: the link, printed once, and when it
/// expires.
async fn user_link(
    config: &Config,
    name: &str,
    kind: ConsoleLinkKind,
    json_output: bool,
) -> ExitCode {
    let link = match kind {
        ConsoleLinkKind::Invite => admin::invite(config, name).await,
        ConsoleLinkKind::SignIn => admin::sign_in_link(config, name).await,
    };
    let result = link.and_then(|link| Ok(serde_json::to_value(link)?));
    finish(result, json_output, |answer| {
        println!("{}", text(&answer["url"]));
        let left_ms = (answer["expires_at_ms"].as_i64().unwrap_or(0)
            - agentworks_support::clock::now_ms())
        .max(0);
        let what = match kind {
            ConsoleLinkKind::Invite => format!(
                "invite for {name}: it sets their password; expires in {} h",
                left_ms / 3_600_000
            ),
            ConsoleLinkKind::SignIn => format!(
                "console sign-in link for {name}: it works once; expires in {} min",
                left_ms / 60_000
            ),
        };
        println!(
            "(a one-time {what}, at {} ms since the epoch)",
            answer["expires_at_ms"]
        );
    })
}

/// Print an answer (`--json`: as is) or the refusal; the exit code.
fn finish(
    result: Result<Value, CtlError>,
    json_output: bool,
    human: impl FnOnce(&Value),
) -> ExitCode {
    match result {
        Ok(answer) => {
            if json_output {
                println!("{answer}");
            } else {
                human(&answer);
            }
            ExitCode::SUCCESS
        }
        Err(e @ CtlError::Usage(_)) => {
            eprintln!("agentworksctl: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("agentworksctl: {e}");
            ExitCode::from(1)
        }
    }
}

/// A typed request as the JSON body [`admin::call`] sends.
fn body<T: Serialize>(request: T) -> Result<Value, CtlError> {
    Ok(serde_json::to_value(request)?)
}

fn role(raw: &str) -> Result<Role, CtlError> {
    Role::parse(raw).ok_or_else(|| {
        CtlError::Usage(format!(
            "{raw:?} is not a role: owner, co-owner, editor, runner or viewer"
        ))
    })
}

/// `project add`: the policy defaults to the whole project writable (`.`).
fn project_add(p: ProjectAdd) -> Result<Value, CtlError> {
    let Some(kind) = ProjectKind::parse(&p.kind) else {
        return Err(CtlError::Usage(format!(
            "--kind {:?}: use workflow or code",
            p.kind
        )));
    };
    let write_paths = if p.write_paths.is_empty() {
        vec![".".to_string()]
    } else {
        p.write_paths
    };
    body(ProjectRequest {
        name: p.name,
        kind,
        owner: p.owner,
        folder: p.folder,
        policy: Some(Guard {
            write_paths,
            blocked_paths: p.blocked_paths,
            blocked_write_paths: p.blocked_write_paths,
            read_only_paths: p.read_only_paths,
        }),
    })
}

/// `token create`: every scope checked, the lifetime turned into an absolute expiry.
fn token_create(t: TokenCreate) -> Result<Value, CtlError> {
    let mut scopes = Vec::with_capacity(t.scopes.len());
    for scope in &t.scopes {
        let Some(parsed) = Scope::parse(scope) else {
            return Err(CtlError::Usage(format!(
                "--scope {scope:?}: use workflows:read, workflows:run, workflows:write, devices:connect or devices:approve"
            )));
        };
        scopes.push(parsed);
    }
    let expires_at_ms = match &t.expires_in {
        Some(d) => Some(agentworks_support::clock::now_ms() + admin::parse_duration_ms(d)?),
        None => None,
    };
    body(CreateTokenRequest {
        user: t.user,
        scopes,
        label: t.label,
        project: t.project,
        expires_at_ms,
        write_folders: (!t.write_folders.is_empty()).then_some(t.write_folders),
        read_only_folders: t.read_only_folders,
    })
}

fn print_text(endpoint: &str, answer: &Value) {
    match endpoint {
        "tokens/create" => {
            println!(
                "token {} for {} ({})",
                text(&answer["info"]["id"]),
                text(&answer["info"]["user_name"]),
                joined(&answer["info"]["scopes"], " ")
            );
            println!("{}", text(&answer["token"]));
            println!("(shown once: store it now; only its hash is kept)");
        }
        "users/list" | "projects/list" | "members/list" | "tokens/list" => {
            for row in answer.as_array().into_iter().flatten() {
                println!("{}", list_line(endpoint, row));
            }
        }
        _ => println!(
            "{}",
            serde_json::to_string_pretty(answer).unwrap_or_default()
        ),
    }
}

/// One row of a list answer as a line of text.
fn list_line(endpoint: &str, row: &Value) -> String {
    match endpoint {
        "users/list" => format!(
            "{:<24} {}{}",
            text(&row["name"]),
            text(&row["id"]),
            if row["disabled"] == true {
                "  (disabled)"
            } else {
                ""
            }
        ),
        "projects/list" => format!(
            "{:<24} {:<9} folder={} id={}",
            text(&row["name"]),
            text(&row["kind"]),
            text(&row["folder"]),
            text(&row["id"])
        ),
        "members/list" => format!("{:<24} {}", text(&row["user"]), text(&row["role"])),
        _ => format!(
            "{}  {:<16} {:<40} {}{}",
            text(&row["id"]),
            text(&row["user_name"]),
            joined(&row["scopes"], ","),
            text(&row["label"]),
            if row["revoked_at_ms"].is_null() {
                ""
            } else {
                "  (revoked)"
            }
        ),
    }
}

/// A string field, or nothing.
fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

/// An array of strings joined by `separator`, or nothing.
fn joined(v: &Value, separator: &str) -> String {
    v.as_array()
        .map(|a| a.iter().map(text).collect::<Vec<_>>().join(separator))
        .unwrap_or_default()
}

async fn run_quickstart(
    state_root: PathBuf,
    options: quickstart::Options,
    json_output: bool,
) -> ExitCode {
    let shutdown = shutdown::on_signals();
    let result = quickstart::run(&state_root, &options, shutdown, |started| {
        if json_output {
            println!("{}", serde_json::to_string(started).unwrap_or_default());
        } else {
            quickstart::print_human(started);
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
            ExitCode::from(if e.is_usage() { 2 } else { 1 })
        }
    }
}

async fn status(config: &Config, chosen: &Chosen, json_output: bool) -> ExitCode {
    let report = crate::status(config).await;
    if json_output {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        for d in &report {
            let mark = if d.healthy { "ok  " } else { "DOWN" };
            println!("{mark} {:<24} {}  ({})", d.daemon, d.socket, d.detail);
            match d.providers.as_deref() {
                Some([]) => println!(
                    "       no provider: add one as [runnerd.providers.NAME] in the configuration \
                     (a quickstart: --provider codex=PATH --provider-upstream URL)"
                ),
                Some(providers) => {
                    for provider in providers {
                        println!("       provider {}", crate::provider_line(provider));
                    }
                }
                None => {}
            }
        }
    }
    if *chosen == Chosen::Nothing && report.iter().all(|d| !d.healthy) {
        eprintln!(
            "agentworksctl: no configuration is given, there is no system install and no \
             quickstart of yours runs: start one with `agentworksctl quickstart`, or name one \
             with AGENTWORKS_STATE_ROOT=DIR"
        );
    }
    if report.iter().all(|d| d.healthy) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn body_of(args: &[&str]) -> (&'static str, Value) {
        let cli = Cli::try_parse_from(args).unwrap();
        request(cli.command).unwrap()
    }

    #[test]
    fn console_user_commands_parse() {
        let cli = Cli::try_parse_from(["agentworksctl", "user", "passwd", "ann"]).unwrap();
        assert!(matches!(cli.command, Cmd::User(UserCmd::Passwd { name }) if name == "ann"));
        let cli = Cli::try_parse_from(["agentworksctl", "user", "invite", "ann"]).unwrap();
        assert!(matches!(cli.command, Cmd::User(UserCmd::Invite { name }) if name == "ann"));
        let cli = Cli::try_parse_from(["agentworksctl", "user", "sign-in-link", "ann"]).unwrap();
        assert!(matches!(cli.command, Cmd::User(UserCmd::SignInLink { name }) if name == "ann"));
    }

    /// The typed requests give the JSON the literal bodies gave.
    #[test]
    fn typed_bodies_are_the_literal_ones() {
        assert_eq!(
            body_of(&["agentworksctl", "user", "add", "ann"]),
            ("users/add", json!({ "name": "ann" }))
        );
        assert_eq!(
            body_of(&[
                "agentworksctl",
                "project",
                "add",
                "p",
                "--kind",
                "code",
                "--owner",
                "ann"
            ]),
            (
                "projects/add",
                json!({
                    "name": "p", "kind": "code", "owner": "ann", "folder": null,
                    "policy": {
                        "write_paths": ["."], "blocked_paths": [],
                        "blocked_write_paths": [], "read_only_paths": [],
                    }
                })
            )
        );
        assert_eq!(
            body_of(&[
                "agentworksctl",
                "member",
                "add",
                "--project",
                "p",
                "--user",
                "ann",
                "--role",
                "co-owner"
            ]),
            (
                "members/add",
                json!({ "project": "p", "user": "ann", "role": "co-owner" })
            )
        );
        assert_eq!(
            body_of(&[
                "agentworksctl",
                "token",
                "create",
                "--user",
                "ann",
                "--scope",
                "workflows:read",
                "--read-only-folder",
                "docs"
            ]),
            (
                "tokens/create",
                json!({
                    "user": "ann", "scopes": ["workflows:read"], "project": null, "label": null,
                    "expires_at_ms": null, "write_folders": null, "read_only_folders": ["docs"],
                })
            )
        );
        assert_eq!(
            body_of(&["agentworksctl", "token", "revoke", "t1"]),
            ("tokens/revoke", json!({ "id": "t1" }))
        );
        assert_eq!(
            body_of(&[
                "agentworksctl",
                "receipt",
                "show",
                "r1",
                "--project",
                "p",
                "--user",
                "ann"
            ]),
            (
                "receipts/show",
                json!({ "project": "p", "request_id": "r1", "user": "ann" })
            )
        );
        assert_eq!(
            body_of(&[
                "agentworksctl",
                "login",
                "approve",
                "ABCD-EFGH",
                "--user",
                "ann"
            ]),
            (
                "login/approve",
                json!({ "user_code": "ABCD-EFGH", "user": "ann" })
            )
        );
    }

    #[test]
    fn bad_roles_kinds_and_scopes_are_usage_errors() {
        for args in [
            &[
                "agentworksctl",
                "member",
                "add",
                "--project",
                "p",
                "--user",
                "u",
                "--role",
                "boss",
            ][..],
            &[
                "agentworksctl",
                "project",
                "add",
                "p",
                "--kind",
                "doc",
                "--owner",
                "u",
            ],
            &[
                "agentworksctl",
                "token",
                "create",
                "--user",
                "u",
                "--scope",
                "root",
            ],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert!(
                matches!(request(cli.command), Err(CtlError::Usage(_))),
                "{args:?}"
            );
        }
    }
}
