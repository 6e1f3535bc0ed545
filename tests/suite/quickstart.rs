//! `agentworksctl quickstart` from a clean directory: starts, prints what scripts need, serves,
//! and stops every daemon on Ctrl-C (SIGINT).

use super::harness::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn quickstart_starts_serves_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("qs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["quickstart", "--json", "--state-root"])
        .arg(&state)
        .env_remove("AGENTWORKS_STATE_ROOT")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let started: serde_json::Value =
        serde_json::from_str(&line).expect("first stdout line is JSON");
    let socket = std::path::PathBuf::from(started["workspaced_socket"].as_str().unwrap());
    assert_eq!(started["project"], "demo");

    // It serves the demo project for real.
    let client = Client {
        inner: agentworks::ipc::client::UnixClient::new(&socket),
    };
    let read = client.read(&ctx("demo", "demo"), "code/task.py").unwrap();
    assert!(read["content"].as_str().unwrap().contains("hello"));

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

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "quickstart exits 0 after Ctrl-C: {exit}");
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "workspaced stopped too"
    );

    // Running it again reuses the state root (the demo files are not recreated over edits).
    std::fs::write(state.join("documents/demo/README.md"), "edited\n").unwrap();
    let mut again = Command::new(env!("CARGO_BIN_EXE_agentworksctl"))
        .args(["quickstart", "--json", "--state-root"])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(again.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("workspaced_socket"));
    assert_eq!(
        std::fs::read_to_string(state.join("documents/demo/README.md")).unwrap(),
        "edited\n"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(again.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(again.wait().unwrap().success());
}
