//! `agentworksctl quickstart` from a clean directory: starts every daemon, prints what scripts
//! need (a working MCP URL and token), and stops every daemon on Ctrl-C (SIGINT).

use super::harness::*;
use std::process::Command;

fn start_quickstart(state: &std::path::Path, ports: [u16; 2]) -> QuickstartRun {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentworksctl"));
    command
        .args(quickstart_args(state, ports))
        .env_remove("AGENTWORKS_STATE_ROOT")
        .env_remove("AGENTWORKS_CONFIG");
    QuickstartRun::spawn(command)
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
    let (mut child, started) = (run.child, run.started);
    for key in [
        "mcp_url",
        "api_url",
        "gateway_url",
        "token",
        "workflow_id",
        "state_root",
        "documents_root",
    ] {
        assert!(started.get(key).is_some(), "{key} missing from {started}");
    }
    assert_eq!(started["mcp_url"], format!("http://127.0.0.1:{port}/mcp"));
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

    // Running it again reuses the state root: the same workflow, the edit kept, a new token.
    let ports = reserve_ports(2);
    let run = start_quickstart(&state, [ports[0], ports[1]]);
    let (again, second) = (run.child, run.started);
    assert_eq!(second["workflow_id"], started["workflow_id"]);
    assert_ne!(second["token"], started["token"]);
    assert_eq!(
        std::fs::read_to_string(state.join("documents/demo/code/task.py")).unwrap(),
        "print('edited')\n"
    );
    let mut again = again;
    signal(&again, nix::sys::signal::Signal::SIGTERM);
    assert!(again.wait().unwrap().success());
}
