//! `agentworksctl quickstart` from a clean directory: starts every daemon, prints what scripts
//! need (a working MCP URL and token, the console URL, a code project), and stops every daemon
//! on Ctrl-C (SIGINT); `--config` and `--model-url`/`--model` give its agent a model (the
//! scripted one of [`super::agent`]). What a newcomer met in their first hour (issue 43): the
//! other commands find a running quickstart with no environment, a relative
//! `AGENTWORKS_STATE_ROOT` works, mistakes are refused before anything starts, a restart keeps
//! the token, and the daemons' logs in a file are plain text. Its log (every daemon's stderr)
//! keeps one line per event whatever a caller or a model puts in a path or a message.
//! runnerd (issue 45) is its fourth daemon: `--provider NAME=PATH --provider-upstream URL`
//! gives it a provider, listed on its socket (a missing executable as unavailable), and bad
//! provider flags are refused before anything starts.

use super::agent::{Model, http_error, text};
use super::harness::*;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn quickstart_command(state: &std::path::Path, ports: [u16; 2], extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworksctl"));
    command
        .args(quickstart_args(state, ports))
        .args(extra)
        .env_remove("AGENTWORKS_STATE_ROOT")
        .env_remove("AGENTWORKS_CONFIG");
    command
}

fn start_quickstart(state: &std::path::Path, ports: [u16; 2]) -> QuickstartRun {
    QuickstartRun::spawn(quickstart_command(state, ports, &[]))
}

/// One chat-API request to a quickstart's agentd with its token.
fn call(started: &Value, method: &str, path: &str, body: Value) -> (u16, Value) {
    let port = port_of(started);
    let auth = format!("Bearer {}", started["token"].as_str().unwrap());
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, _, text) = http(
        port,
        method,
        path,
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &body,
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn port_of(started: &Value) -> u16 {
    started["api_url"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A new chat in the quickstart's code project: its id.
fn new_chat(started: &Value) -> String {
    let (status, chat) = call(
        started,
        "POST",
        "/v1/chats",
        json!({"project": started["code_project_id"]}),
    );
    assert_eq!(status, 201, "{chat}");
    chat["chat_id"].as_str().unwrap().to_owned()
}

/// One turn in `chat`: its events, or the refusal.
fn turn_in(
    started: &Value,
    chat: &str,
    message: &str,
) -> Result<Vec<(String, Value)>, (u16, Value)> {
    super::agent::turn(
        port_of(started),
        started["token"].as_str().unwrap(),
        chat,
        message,
    )
}

/// A chat in the quickstart's code project and one turn in it: its events, or the refusal.
fn chat_turn(started: &Value, message: &str) -> Result<Vec<(String, Value)>, (u16, Value)> {
    turn_in(started, &new_chat(started), message)
}

fn stop(mut run: QuickstartRun) {
    signal(run.child(), nix::sys::signal::Signal::SIGTERM);
    assert!(run.child().wait().unwrap().success());
}

fn signal(child: &std::process::Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

#[test]
fn quickstart_starts_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let ports = reserve_ports(2);
    let (port, gateway_port) = (ports[0], ports[1]);
    let run = start_quickstart(&state, [port, gateway_port]);
    let (mut child, started) = run.into_parts();
    for key in [
        "mcp_url",
        "api_url",
        "gateway_url",
        "token",
        "workflow_id",
        "code_project_id",
        "console_url",
        "state_root",
        "documents_root",
    ] {
        assert!(started.get(key).is_some(), "{key} missing from {started}");
    }
    assert_eq!(started["mcp_url"], format!("http://127.0.0.1:{port}/mcp"));
    assert_eq!(
        started["console_url"],
        format!("http://127.0.0.1:{port}/console/")
    );
    assert_eq!(started["model"], Value::Null);
    // runnerd runs too, with no provider.
    assert_eq!(started["providers"], json!([]), "{started}");
    assert_eq!(runnerd_providers(&started), json!([]));

    // The printed sign-in link signs the demo user in to the console, once.
    let link = started["sign_in_link"].as_str().unwrap();
    let code = link
        .strip_prefix(&format!("http://127.0.0.1:{port}/console/sign-in#code="))
        .unwrap_or_else(|| panic!("unexpected sign-in link {link}"));
    let sign_in = json!({"link_code": code}).to_string();
    let origin = format!("http://127.0.0.1:{port}");
    let headers = [
        ("content-type", "application/json"),
        ("origin", origin.as_str()),
    ];
    let (status, _, body) = http(port, "POST", "/v1/console/sign-in", &headers, &sign_in);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"name\":\"demo\""), "{body}");
    let (status, _, body) = http(port, "POST", "/v1/console/sign-in", &headers, &sign_in);
    assert_eq!(status, 401, "a sign-in link worked twice: {body}");

    // The demo user owns the demo workflow and a code project, which has chats; without a
    // model, a turn keeps the message and answers model_not_configured.
    let (status, body) = call(&started, "GET", "/v1/projects", Value::Null);
    assert_eq!(status, 200, "{body}");
    let mut projects: Vec<(String, String, String, String)> = body["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let field = |k: &str| p[k].as_str().unwrap().to_owned();
            (field("name"), field("kind"), field("role"), field("id"))
        })
        .collect();
    projects.sort();
    assert_eq!(
        projects,
        [
            (
                "demo".into(),
                "workflow".into(),
                "owner".into(),
                started["workflow_id"].as_str().unwrap().to_owned()
            ),
            (
                "demo-code".into(),
                "code".into(),
                "owner".into(),
                started["code_project_id"].as_str().unwrap().to_owned()
            ),
        ]
    );
    let (status, body) = call(&started, "GET", "/v1/models", Value::Null);
    assert_eq!(
        (status, body),
        (
            200,
            json!({"configured": false, "model": null, "base_url": null})
        )
    );
    // Issue 43, item 7: the refusal named only the config file to a quickstart user, and the
    // message was dropped, leaving an empty chat. Now the message is kept (and titles the
    // chat), and the error names both ways to configure a model.
    let chat = new_chat(&started);
    let events = turn_in(&started, &chat, "hello?\nis anyone there").unwrap();
    let errors = super::agent::of_kind(&events, "error");
    assert_eq!(errors.len(), 1, "{events:?}");
    assert_eq!(errors[0]["code"], "model_not_configured", "{events:?}");
    let said = errors[0]["message"].as_str().unwrap();
    for needed in ["[agentd.model]", "--model-url URL --model NAME", "kept"] {
        assert!(said.contains(needed), "{needed:?} missing from {said:?}");
    }
    assert_eq!(events.last().unwrap().1["reason"], "error", "{events:?}");
    let (status, kept) = call(&started, "GET", &format!("/v1/chats/{chat}"), Value::Null);
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["title"], "hello?", "{kept}");
    assert_eq!(kept["messages"].as_array().unwrap().len(), 1, "{kept}");
    assert_eq!(kept["messages"][0]["role"], "user", "{kept}");
    assert_eq!(
        kept["messages"][0]["content"], "hello?\nis anyone there",
        "{kept}"
    );
    assert_eq!(
        started["gateway_url"],
        format!("ws://127.0.0.1:{gateway_port}")
    );
    // The executor WebSocket answers (a request without a token is refused, not ignored).
    let (status, _, _) = http(gateway_port, "GET", "/v1/executor", &[], "");
    assert_eq!(status, 401);
    assert_eq!(
        started["mcp_client_config"]["mcpServers"]["agentworks"]["url"],
        started["mcp_url"]
    );

    // The printed URL and token work: read a demo file through MCP, then write one.
    let token = started["token"].as_str().unwrap();
    let read = tool_result(
        port,
        token,
        "read_file",
        serde_json::json!({"workflow_id": started["workflow_id"], "path": "code/task.py"}),
    )
    .unwrap();
    assert!(read["content"].as_str().unwrap().contains("hello"));
    let written = tool_result(
        port,
        token,
        "write_file",
        serde_json::json!({"workflow_id": started["workflow_id"], "path": "code/task.py",
            "content": "print('edited')\n", "expected_revision": read["revision"], "request_id": "qs-1"}),
    )
    .unwrap();
    assert_eq!(written["state"], "applied");

    // `agentworksctl status` finds it through AGENTWORKS_STATE_ROOT.
    let status = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["status", "--json"])
        .env(
            "AGENTWORKS_STATE_ROOT",
            started["state_root"].as_str().unwrap(),
        )
        .env("AGENTWORKS_CONFIG", state.join("agentworks.toml"))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );

    signal(&child, nix::sys::signal::Signal::SIGINT);
    let exit = child.wait().unwrap();
    assert!(exit.success(), "quickstart exits 0 after Ctrl-C: {exit}");
    let socket = std::path::PathBuf::from(started["workspaced_socket"].as_str().unwrap());
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "workspaced stopped too"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "agentd stopped too"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", gateway_port)).is_err(),
        "gatewayd stopped too"
    );
    assert!(
        std::os::unix::net::UnixStream::connect(started["runnerd_socket"].as_str().unwrap())
            .is_err(),
        "runnerd stopped too"
    );

    // Running it again reuses the state root: the same workflow, the edit kept, the same
    // token (see quickstart_keeps_its_token_while_valid_and_revokes_what_it_replaces). This
    // time with a model: the chat whose turn had none goes on from the message it kept.
    let model = Model::start();
    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn(quickstart_command(
        &state,
        [ports[0], ports[1]],
        &["--model-url", &model.base_url(), "--model", "scripted"],
    ));
    let (again, second) = run.into_parts();
    model.play(vec![text("yes, I am here")]);
    let events = turn_in(&second, &chat, "now?").unwrap();
    assert_eq!(
        super::agent::answer_text(&events),
        "yes, I am here",
        "{events:?}"
    );
    let asked = model.requests()[0]["messages"].to_string();
    assert!(
        asked.contains("hello?\\nis anyone there") && asked.contains("now?"),
        "the model did not get the kept message: {asked}"
    );
    let (_, continued) = call(&second, "GET", &format!("/v1/chats/{chat}"), Value::Null);
    assert_eq!(continued["title"], "hello?", "the title stays: {continued}");
    assert_eq!(continued["turns"], 2, "{continued}");
    assert_eq!(second["workflow_id"], started["workflow_id"]);
    assert_eq!(second["code_project_id"], started["code_project_id"]);
    assert_eq!(second["token"], started["token"]);
    assert_eq!(
        std::fs::read_to_string(state.join("documents/demo/code/task.py")).unwrap(),
        "print('edited')\n"
    );
    let mut again = again;
    signal(&again, nix::sys::signal::Signal::SIGTERM);
    assert!(again.wait().unwrap().success());
}

/// `--config FILE`: its `[agentd.model]` reaches agentd (a chat turn in the code project is
/// answered by the scripted model) and its other sections are kept, while quickstart's own
/// settings win: the file's listen address, runtime directory and state root are not used.
#[test]
fn quickstart_merges_the_config_file_and_its_model_answers_a_turn() {
    let model = Model::start();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let config = dir.path().join("mine.toml");
    std::fs::write(
        &config,
        format!(
            "state_root = \"/var/lib/agentworks\"\nruntime_dir = \"/run/agentworks-not-this\"\n\
             [agentd]\nlisten = \"127.0.0.1:1\"\nmax_sessions_per_token = 3\n\n\
             [gatewayd]\nheartbeat_secs = 7\n\n{}",
            model.config()
        ),
    )
    .unwrap();
    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn(quickstart_command(
        &state,
        [ports[0], ports[1]],
        &["--config", config.to_str().unwrap()],
    ));
    assert_eq!(run.started["model"], "scripted", "{}", run.started);
    assert_eq!(
        run.started["api_url"],
        format!("http://127.0.0.1:{}", ports[0])
    );
    let (status, body) = call(&run.started, "GET", "/v1/models", Value::Null);
    assert_eq!(
        (status, body),
        (
            200,
            json!({"configured": true, "model": "scripted", "base_url": model.base_url()})
        )
    );
    model.play(vec![text("hello from the configured model")]);
    let events = chat_turn(&run.started, "hello?").unwrap();
    assert_eq!(
        super::agent::answer_text(&events),
        "hello from the configured model",
        "{events:?}"
    );
    assert_eq!(
        events.last().unwrap().1["reason"],
        "completed",
        "{events:?}"
    );
    assert_eq!(model.requests()[0]["model"], "scripted");
    // The written configuration: the file's other settings kept, quickstart's own won.
    let written = std::fs::read_to_string(state.join("agentworks.toml")).unwrap();
    assert!(written.contains("max_sessions_per_token = 3"), "{written}");
    assert!(written.contains("heartbeat_secs = 7"), "{written}");
    assert!(!written.contains("/var/lib/agentworks\""), "{written}");
    assert!(!written.contains("agentworks-not-this"), "{written}");
    assert!(!written.contains("127.0.0.1:1\""), "{written}");
    assert!(state.join("run/agentd.sock").exists());
    stop(run);
}

/// `--model-url URL --model NAME --model-key-file F`: the model answers a turn, gets the key
/// from the file, and the key is never printed. An unreadable or empty key file, or a
/// `--model-url` without `--model`, is refused before any daemon starts.
#[test]
fn quickstart_takes_a_model_from_its_flags_and_refuses_a_bad_key_file() {
    let model = Model::start();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let key = dir.path().join("model.key");
    std::fs::write(&key, "sk-quickstart-7f3a\n").unwrap();
    let empty = dir.path().join("empty.key");
    std::fs::write(&empty, "\n").unwrap();
    let url = model.base_url();

    let refusals: [(&[&str], &str); 3] = [
        (
            &[
                "--model-url",
                &url,
                "--model",
                "m",
                "--model-key-file",
                "/nonexistent/key",
            ],
            "/nonexistent/key",
        ),
        (
            &[
                "--model-url",
                &url,
                "--model",
                "m",
                "--model-key-file",
                empty.to_str().unwrap(),
            ],
            "is empty",
        ),
        (&["--model-url", &url], "--model"),
    ];
    for (flags, says) in refusals {
        let ports = reserve_ports(2);
        let out = quickstart_command(&state, [ports[0], ports[1]], flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_err(),
            "{flags:?}: agentd was started"
        );
    }

    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn(quickstart_command(
        &state,
        [ports[0], ports[1]],
        &[
            "--model-url",
            &url,
            "--model",
            "flagged",
            "--model-key-file",
            key.to_str().unwrap(),
        ],
    ));
    assert_eq!(run.started["model"], "flagged", "{}", run.started);
    assert!(!run.started.to_string().contains("sk-quickstart"));
    model.play(vec![text("hello from the flagged model")]);
    let events = chat_turn(&run.started, "hello?").unwrap();
    assert_eq!(
        super::agent::answer_text(&events),
        "hello from the flagged model",
        "{events:?}"
    );
    assert_eq!(model.requests()[0]["model"], "flagged");
    assert_eq!(
        model.authorizations(),
        [Some("Bearer sk-quickstart-7f3a".to_owned())]
    );
    let written = std::fs::read_to_string(state.join("agentworks.toml")).unwrap();
    assert!(!written.contains("sk-quickstart"), "{written}");
    stop(run);
}

/// Issue 45: `--provider codex=PATH --provider-upstream URL` gives runnerd, the fourth daemon,
/// a provider: runnerd lists it on its socket with the executable the test made, the written
/// configuration holds the key file made absolute (and never the key), and `status` shows it.
/// A provider whose executable is missing does not stop the start: it is listed as
/// unavailable, naming the missing file.
#[test]
fn quickstart_starts_runnerd_with_the_providers_its_flags_give() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let codex = dir.path().join("my-codex");
    executable_file(&codex);
    std::fs::write(dir.path().join("provider.key"), "sk-provider-51e0\n").unwrap();
    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn({
        let mut command = quickstart_command(
            &state,
            [ports[0], ports[1]],
            &[
                "--provider",
                &format!("codex={}", codex.display()),
                "--provider-upstream",
                "http://127.0.0.1:9/v1",
                "--provider-key-file",
                "provider.key",
            ],
        );
        // The key file is named relative to here.
        command.current_dir(dir.path());
        command
    });
    let expected = json!([{
        "name": "codex",
        "driver": "codex",
        "model": "gpt-5.5",
        "executable": codex.to_str().unwrap(),
    }]);
    assert_eq!(runnerd_providers(&run.started), expected);
    assert_eq!(run.started["providers"], expected, "{}", run.started);
    assert!(!run.started.to_string().contains("sk-provider"));
    let written = std::fs::read_to_string(state.join("agentworks.toml")).unwrap();
    let key_file = dir.path().join("provider.key").canonicalize().unwrap();
    for line in [
        "[runnerd.providers.codex]".to_owned(),
        format!("key_file = \"{}\"", key_file.display()),
        "upstream = \"http://127.0.0.1:9/v1\"".to_owned(),
    ] {
        assert!(written.contains(&line), "{line:?} missing from {written}");
    }
    assert!(!written.contains("sk-provider"), "{written}");

    // status: runnerd among the daemons, with its provider, in JSON and for people.
    let root = run.started["state_root"].as_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["status", "--json"])
        .env("AGENTWORKS_STATE_ROOT", root)
        .env_remove("AGENTWORKS_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_status_under(&stdout, root);
    let report: Vec<Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report[3]["providers"], expected, "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .arg("status")
        .env("AGENTWORKS_STATE_ROOT", root)
        .env_remove("AGENTWORKS_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok   agentworks-runnerd")
            && stdout.contains(&format!(
                "provider codex (driver codex, model gpt-5.5): {}",
                codex.display()
            )),
        "{stdout}"
    );
    stop(run);

    // The executable gone: runnerd still starts, and says which provider cannot run and why.
    std::fs::remove_file(&codex).unwrap();
    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn(quickstart_command(
        &state,
        [ports[0], ports[1]],
        &[
            "--provider",
            &format!("codex={}", codex.display()),
            "--provider-upstream",
            "http://127.0.0.1:9/v1",
            "--provider-model",
            "o-test",
        ],
    ));
    let providers = runnerd_providers(&run.started);
    assert_eq!(providers, run.started["providers"]);
    let listed = providers.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{providers}");
    assert_eq!(listed[0]["name"], "codex");
    assert_eq!(listed[0]["model"], "o-test");
    assert!(listed[0].get("executable").is_none(), "{providers}");
    let why = listed[0]["unavailable"].as_str().unwrap();
    assert!(
        why.contains(codex.to_str().unwrap()) && why.contains("does not exist"),
        "{why}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .arg("status")
        .env(
            "AGENTWORKS_STATE_ROOT",
            run.started["state_root"].as_str().unwrap(),
        )
        .env_remove("AGENTWORKS_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("provider codex (driver codex, model o-test): UNAVAILABLE"),
        "{stdout}"
    );
    stop(run);
}

/// Issue 45: provider flags a person got wrong are refused (exit 2) with what to change, before
/// the state root is made or any daemon starts: `--provider` without `--provider-upstream`, a
/// driver runnerd does not have (the ones it has are listed), a key file that does not exist
/// (named as given, relative), an upstream that would carry the key in clear.
#[test]
fn quickstart_refuses_bad_provider_flags_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let codex = dir.path().join("codex");
    executable_file(&codex);
    let codex = format!("codex={}", codex.display());
    let upstream = "http://127.0.0.1:9/v1";
    let refusals: [(&[&str], &[&str]); 5] = [
        (&["--provider", &codex], &["--provider-upstream"]),
        (
            &["--provider-upstream", upstream],
            &["--provider <NAME=PATH>"],
        ),
        (
            &[
                "--provider",
                "gemini=/usr/bin/gemini",
                "--provider-upstream",
                upstream,
            ],
            &[
                "--provider \"gemini=/usr/bin/gemini\"",
                "runnerd has no driver \"gemini\"",
                "has: codex, claude",
            ],
        ),
        (
            &[
                "--provider",
                &codex,
                "--provider-upstream",
                upstream,
                "--provider-key-file",
                "no-such.key",
            ],
            &["no-such.key", "--provider-key-file", "cannot be opened"],
        ),
        (
            &[
                "--provider",
                &codex,
                "--provider-upstream",
                "http://example.com/v1",
            ],
            &[
                "--provider-upstream \"http://example.com/v1\"",
                "loopback host only",
            ],
        ),
    ];
    for (flags, says) in refusals {
        let ports = reserve_ports(2);
        let (code, stderr) = refused_at_start(&state, [ports[0], ports[1]], flags);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        for said in says {
            assert!(
                stderr.contains(said),
                "{flags:?}: {said:?} missing from {stderr}"
            );
        }
        for port in ports {
            assert!(
                std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
                "{flags:?}: a daemon was started"
            );
        }
        assert!(
            !state.exists(),
            "{flags:?}: the state root was made before the refusal"
        );
    }
}

/// `agentworksctl OPTIONS…` run in `cwd` with no agentworks configuration in its environment
/// and `state_home` as its `XDG_STATE_HOME` (where quickstarts record themselves): exit code,
/// stdout, stderr.
fn ctl_without_config(cwd: &Path, state_home: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(args)
        .current_dir(cwd)
        .env_remove("AGENTWORKS_STATE_ROOT")
        .env_remove("AGENTWORKS_CONFIG")
        .env_remove("AGENTWORKS_RUNTIME_DIR")
        .env("XDG_STATE_HOME", state_home)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether this machine has a system install, which `agentworksctl` prefers to a quickstart.
fn system_install() -> bool {
    Path::new("/etc/agentworks/agentworks.toml").exists()
        || Path::new("/run/agentworks/agentd.sock").exists()
}

/// Every socket `status --json` reported, each under `root`.
fn assert_status_under(stdout: &str, root: &str) {
    let report: Vec<Value> = serde_json::from_str(stdout).unwrap();
    assert_eq!(report.len(), 4, "{stdout}");
    assert_eq!(report[3]["daemon"], "agentworks-runnerd", "{stdout}");
    for daemon in &report {
        assert!(
            daemon["socket"].as_str().unwrap().starts_with(root),
            "{stdout}"
        );
        assert_eq!(daemon["healthy"], true, "{stdout}");
    }
}

/// Issue 43: `agentworksctl status` with no environment, while a quickstart runs, reported the
/// system's sockets as DOWN. A running quickstart records itself and the other commands use it
/// (saying so), ignore a record whose daemons are gone, and refuse to guess between two
/// (except the one in this directory); `AGENTWORKS_STATE_ROOT=.agentworks-quickstart`, relative
/// as `--help` shows it, works.
#[test]
fn status_finds_a_running_quickstart_with_no_environment() {
    let dir = tempfile::tempdir().unwrap();
    let state_home = dir.path().join("state-home");
    std::fs::create_dir(&state_home).unwrap();
    let (here, elsewhere) = (dir.path().join("here"), dir.path().join("elsewhere"));
    std::fs::create_dir(&here).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    let state = here.join(".agentworks-quickstart");
    let ports = reserve_ports(2);
    let run = QuickstartRun::spawn({
        let mut command = quickstart_command(&state, [ports[0], ports[1]], &[]);
        command
            .env("XDG_STATE_HOME", &state_home)
            .current_dir(&here);
        command
    });
    let root = run.started["state_root"].as_str().unwrap().to_owned();
    let record = PathBuf::from(run.started["record"].as_str().unwrap());
    assert!(record.starts_with(&state_home), "{}", record.display());
    let recorded = std::fs::read_to_string(&record).unwrap();
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let (code, stdout, stderr) =
        ctl_without_config(Path::new("/"), &state_home, &["status", "--json"]);
    if system_install() {
        // The system install wins, and the quickstart beside it is named, never passed over
        // in silence.
        assert!(
            stderr.contains("system install") && stderr.contains(&root),
            "{stderr}"
        );
    } else {
        assert_eq!(code, 0, "{stdout}{stderr}");
        assert_status_under(&stdout, &root);
        assert!(
            stderr.contains(&format!("using the quickstart running at {root}")),
            "{stderr}"
        );
        // Every command, not only status.
        let (code, stdout, stderr) =
            ctl_without_config(Path::new("/"), &state_home, &["user", "list"]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains("demo"), "{stdout}");
    }

    // The --help example, relative to this directory; no record is needed for it.
    let empty_home = dir.path().join("empty-state-home");
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["status", "--json"])
        .current_dir(&here)
        .env("AGENTWORKS_STATE_ROOT", ".agentworks-quickstart")
        .env_remove("AGENTWORKS_CONFIG")
        .env_remove("AGENTWORKS_RUNTIME_DIR")
        .env("XDG_STATE_HOME", &empty_home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_status_under(&String::from_utf8_lossy(&out.stdout), &root);
    assert!(!stderr.contains("using the quickstart"), "{stderr}");

    // A second quickstart of the same person: from a third directory neither is guessed; in
    // either one's directory, that one is used.
    let other_state = elsewhere.join(".agentworks-quickstart");
    let ports = reserve_ports(2);
    let other = QuickstartRun::spawn({
        let mut command = quickstart_command(&other_state, [ports[0], ports[1]], &[]);
        command.env("XDG_STATE_HOME", &state_home);
        command
    });
    let other_root = other.started["state_root"].as_str().unwrap().to_owned();
    if !system_install() {
        let (code, _, stderr) = ctl_without_config(Path::new("/"), &state_home, &["status"]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(&root) && stderr.contains(&other_root),
            "{stderr}"
        );
        assert!(stderr.contains("AGENTWORKS_STATE_ROOT=DIR"), "{stderr}");
        for (cwd, expected) in [(&here, &root), (&elsewhere, &other_root)] {
            let (code, stdout, stderr) =
                ctl_without_config(cwd, &state_home, &["status", "--json"]);
            assert_eq!(code, 0, "{stderr}");
            assert_status_under(&stdout, expected);
        }
    }
    stop(other);

    // Stopped, its record is gone; a record left behind (a quickstart killed with SIGKILL
    // cannot remove its own) is ignored once its daemons are gone.
    stop(run);
    assert!(!record.exists(), "the record outlived its quickstart");
    std::fs::write(&record, &recorded).unwrap();
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, _, stderr) = ctl_without_config(Path::new("/"), &state_home, &["status"]);
    assert!(!stderr.contains("using the quickstart"), "{stderr}");
    if !system_install() {
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains("agentworksctl quickstart"), "{stderr}");
    }
}

/// `quickstart OPTIONS…` that must be refused before anything starts: its exit code and stderr,
/// after checking that it printed no start line and that nothing listens on its ports.
fn refused_at_start(state: &Path, ports: [u16; 2], extra: &[&str]) -> (i32, String) {
    use std::io::BufRead;
    let state_home = tempfile::tempdir().unwrap();
    let mut command = quickstart_command(state, ports, extra);
    let mut child = command
        .env("XDG_STATE_HOME", state_home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    if !line.is_empty() {
        // Stopped as Ctrl-C would, so that its daemons stop too.
        signal(&child, nix::sys::signal::Signal::SIGTERM);
        let _ = child.wait();
        panic!("{extra:?}: quickstart started: {line}");
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 43: mistakes were found at first use, or reported where a person would not look. A
/// plain-http model URL to another machine, an unknown key in `--config` (named at its line of
/// the person's file, not of the merged one quickstart writes), and a busy port (with the flag
/// that changes it) are refused (exit 2) before anything is made or started.
#[test]
fn quickstart_refuses_mistakes_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");

    let ports = reserve_ports(2);
    let (code, stderr) = refused_at_start(
        &state,
        [ports[0], ports[1]],
        &["--model-url", "http://example.com/v1", "--model", "m"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--model-url \"http://example.com/v1\"")
            && stderr.contains("loopback host only")
            && stderr.contains("https://"),
        "{stderr}"
    );
    assert!(
        !state.exists(),
        "the state root was made before the refusal"
    );

    let mine = dir.path().join("mine.toml");
    std::fs::write(
        &mine,
        "[agentd]\nmax_sessions_per_token = 3\n\n[gatewayd]\nheartbeat = 5\n",
    )
    .unwrap();
    let (code, stderr) = refused_at_start(
        &state,
        [ports[0], ports[1]],
        &["--config", mine.to_str().unwrap()],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("--config {}", mine.display()))
            && stderr.contains("line 5")
            && stderr.contains("unknown field `heartbeat`"),
        "{stderr}"
    );
    assert!(!stderr.contains("agentworks.toml"), "{stderr}");

    // Each port taken by another program, in turn.
    for (busy, flag) in [(0, "give --port N"), (1, "give --gateway-port M")] {
        let taken = std::net::TcpListener::bind(("127.0.0.1", ports[busy])).unwrap();
        let (code, stderr) = refused_at_start(&state, [ports[0], ports[1]], &[]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(&format!("port {} is in use", ports[busy])) && stderr.contains(flag),
            "{stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        drop(taken);
    }
    for port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "a daemon was started"
        );
    }
    assert!(
        !state.exists(),
        "the state root was made before the refusal"
    );
}

/// `agentworksctl ARGS…` on the quickstart at `state` (named by `AGENTWORKS_STATE_ROOT`): its
/// stdout, once it succeeded.
fn ctl_on(state: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(args)
        .env("AGENTWORKS_STATE_ROOT", state)
        .env_remove("AGENTWORKS_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Every quickstart token of the demo user as `token list` shows it: `(id, revoked)`.
fn quickstart_tokens(state: &Path) -> Vec<(String, bool)> {
    let out = ctl_on(state, &["token", "list", "--user", "demo", "--json"]);
    let listed: Vec<Value> = serde_json::from_slice(&out).unwrap();
    listed
        .iter()
        .filter(|t| t["label"] == "quickstart")
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_owned(),
                !t["revoked_at_ms"].is_null(),
            )
        })
        .collect()
}

/// Issue 43: every restart minted a new `workflows:write` token and never revoked the one
/// before. The token is kept (0600, in the 0700 state root) and printed again while agentd
/// accepts it, so an MCP client configured once keeps working; a revoked one is replaced;
/// and a run that makes a new token revokes the earlier live ones (an older quickstart's).
#[test]
fn quickstart_keeps_its_token_while_valid_and_revokes_what_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let restart = |run: Option<QuickstartRun>| {
        if let Some(run) = run {
            stop(run);
        }
        let ports = reserve_ports(2);
        start_quickstart(&state, [ports[0], ports[1]])
    };
    let first = restart(None);
    let token = first.started["token"].as_str().unwrap().to_owned();
    let id = first.started["token_id"].as_str().unwrap().to_owned();
    assert_eq!(first.started["token_reused"], false);
    let stored = state.join("quickstart-token");
    assert_eq!(std::fs::read_to_string(&stored).unwrap(), token);
    assert_eq!(
        std::fs::metadata(&stored).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A restart prints the same token, and it still works.
    let second = restart(Some(first));
    assert_eq!(second.started["token"], token.as_str());
    assert_eq!(second.started["token_reused"], true);
    let (status, _) = call(&second.started, "GET", "/v1/projects", Value::Null);
    assert_eq!(status, 200);
    assert_eq!(quickstart_tokens(&state), [(id.clone(), false)]);

    // Revoked by an operator: the next run makes a new one (nothing else to revoke).
    ctl_on(&state, &["token", "revoke", &id]);
    let third = restart(Some(second));
    let new_id = third.started["token_id"].as_str().unwrap().to_owned();
    assert_ne!(third.started["token"], token.as_str());
    assert_eq!(third.started["token_reused"], false);
    assert_eq!(third.started["revoked_token_ids"], json!([]));
    let (status, _) = call(&third.started, "GET", "/v1/projects", Value::Null);
    assert_eq!(status, 200);

    // The token file lost (as with a state root an older quickstart made): the live token it
    // held is revoked when a new one is made, so one quickstart token stays live.
    std::fs::remove_file(&stored).unwrap();
    let fourth = restart(Some(third));
    let last_id = fourth.started["token_id"].as_str().unwrap().to_owned();
    assert_eq!(fourth.started["revoked_token_ids"], json!([new_id]));
    let live: Vec<String> = quickstart_tokens(&state)
        .into_iter()
        .filter(|(_, revoked)| !revoked)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(live, [last_id]);
    stop(fourth);
}

/// Issue 43: the daemons' logs, written to a file, held ANSI colour codes and Debug dumps
/// (`PublicLimits { … }`, `Some(…)`). With stderr not a terminal they are plain `key=value`
/// text.
#[test]
fn daemon_logs_in_a_file_hold_no_colour_codes_or_struct_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let ports = reserve_ports(2);
    let run = start_quickstart(&dir.path().join("qs"), [ports[0], ports[1]]);
    let (status, _) = call(&run.started, "GET", "/v1/projects", Value::Null);
    assert_eq!(status, 200);
    let mut run = run;
    signal(run.child(), nix::sys::signal::Signal::SIGTERM);
    assert!(run.child().wait().unwrap().success());
    let log = run.stderr();
    for wanted in [
        "workspaced ready",
        "agentd ready",
        "gatewayd ready",
        "public listener limits",
        "agentd stopped",
    ] {
        assert!(log.contains(wanted), "{wanted}: {log}");
    }
    assert!(!log.contains('\u{1b}'), "an ESC byte: {log:?}");
    for line in log.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        // `Name {`: a struct's Debug dump (`PublicLimits { connections: … }`).
        let struct_dump = words.windows(2).any(|pair| {
            pair[1] == "{"
                && pair[0]
                    .rsplit(['=', '('])
                    .next()
                    .is_some_and(|name| name.starts_with(|c: char| c.is_ascii_uppercase()))
        });
        assert!(!struct_dump, "a struct's Debug dump: {line}");
        assert!(!line.contains("Some("), "an Option's Debug dump: {line}");
    }
    assert!(
        log.contains("public listener limits max_connections="),
        "{log}"
    );
}

/// Issue 42 item 9. `write_file` took a newline, an ESC sequence or U+202E in a path, and the
/// audit line printed the path raw: a line of the path's own making appeared in quickstart's
/// log, as if workspaced had written it. Such paths are refused now (by the one path rule, so
/// `apply_patch` too), and whatever text from outside a log line carries (here a model
/// endpoint's error body, which agentd quotes when a turn fails) is escaped: the log holds no
/// control character but its own line ends, and no line it did not write.
#[test]
fn no_path_or_message_from_outside_forges_a_line_of_quickstarts_log() {
    use agentworks_core::text::is_control_or_bidi;
    const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO agentworks::audit: change applied \
                          agentworks_event=\"write\" agentworks_path=\"approved-by-ops.md\"";
    let model = Model::start();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let config = dir.path().join("model.toml");
    std::fs::write(&config, model.config()).unwrap();
    let ports = reserve_ports(2);
    let mut command = quickstart_command(
        &state,
        [ports[0], ports[1]],
        &["--config", config.to_str().unwrap()],
    );
    command.env("RUST_LOG", "info");
    let run = QuickstartRun::spawn(command);
    let started = run.started.clone();
    let (port, token) = (port_of(&started), started["token"].as_str().unwrap());
    let workflow = started["workflow_id"].clone();
    let write = |path: &str, request_id: &str| {
        tool_result(
            port,
            token,
            "write_file",
            json!({"workflow_id": workflow, "path": path, "content": "x\n",
                "expected_revision": "missing", "request_id": request_id}),
        )
    };
    let documents = std::path::PathBuf::from(started["documents_root"].as_str().unwrap());
    let before = all_files(&documents);

    for (n, path) in [
        format!("notes.md\n{FORGED}"),
        "docs/\x1b]52;c;Zm9yZ2Vk\x07\x1b[2Aok.md".to_owned(),
        "invoice\u{202e}dm.exe".to_owned(),
        "c1\u{9b}2Jx.md".to_owned(),
    ]
    .iter()
    .enumerate()
    {
        let refused = write(path, &format!("forge-{n}")).unwrap_err();
        assert_eq!(
            (&refused["code"], &refused["reason"]),
            (&json!("path_refused"), &json!("control_character")),
            "{path:?}: {refused}"
        );
    }
    let diff = "--- /dev/null\n+++ b/report\u{202e}fdp.exe\n@@ -0,0 +1 @@\n+x\n";
    let refused = tool_result(
        port,
        token,
        "apply_patch",
        json!({"workflow_id": workflow, "diff": diff, "request_id": "forge-patch"}),
    )
    .unwrap_err();
    assert_eq!(refused["code"], "patch_rejected", "{refused}");
    assert_eq!(all_files(&documents), before, "no file was made");

    // Text that is accepted, with a newline and escape sequences in it: the model endpoint's
    // error body, which agentd's "turn failed" line quotes.
    model.play(vec![http_error(
        502,
        &format!("upstream down\n{FORGED}\x1b]52;c;Zm9yZ2Vk\x07\u{202e}"),
    )]);
    let events = chat_turn(&started, "hello?").unwrap();
    assert_eq!(events.last().unwrap().1["reason"], "error", "{events:?}");
    // And a write that is applied, so an audit line is there to be read.
    write("fine.md", "fine").unwrap();

    let mut log = run.stderr.reopen().unwrap();
    stop(run);
    let mut text = String::new();
    std::io::Read::read_to_string(&mut log, &mut text).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("change applied") && l.contains("fine.md")),
        "{text}"
    );
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("turn failed")).collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(
        failed[0].contains("upstream down\\n2026-01-01T00:00:00.000000Z  INFO")
            && failed[0].contains("\\u{1b}]52;c;Zm9yZ2Vk\\u{7}\\u{202e}"),
        "the line quotes the body, escaped: {}",
        failed[0]
    );
    let forged: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("2026-01-01T00:00:00.000000Z"))
        .collect();
    assert!(forged.is_empty(), "forged lines: {forged:?}");
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && is_control_or_bidi(c))
        .collect();
    assert!(raw.is_empty(), "raw control characters in the log: {raw:?}");
}
