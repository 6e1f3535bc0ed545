//! gatewayd in cluster mode (issue 16), end to end: real workspaced, agentd and gatewayd
//! processes, a real PostgreSQL and nats-server from the harness, and a scripted executor that
//! echoes every command. gatewayd keeps devices and requests in the shared database (no
//! `gatewayd.db`), a request id recorded there is never sent again (also by the same host
//! under another name after a restart), and gatewayd refuses to start on a database it cannot
//! reach or on a half-configured `[cluster]`.

use super::harness::{
    FakeExecutor, Gatewayd, Nats, Postgres, Reply, Stack, cluster_section, free_port, wait_until,
};
use agentworks_contract::executor::FolderAccess;
use agentworks_gateway::nats::REVOKED_SUBJECT;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RW: FolderAccess = FolderAccess::ReadWrite;

/// Appends `section` to the stack's config file.
fn append_config(stack: &Stack, section: &str) {
    let path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{config}\n{section}")).unwrap();
}

/// An executor that says hello with folder `proj` and answers every request with its command
/// as stdout.
fn echo_executor(port: u16, token: &str) -> FakeExecutor {
    FakeExecutor::connect(port, token, "laptop", &[("proj", RW)], Reply::Echo)
        .expect("the executor was refused")
}

#[test]
fn gatewayd_on_postgres_keeps_devices_and_requests_in_the_shared_database() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (stack, port) = Stack::start_with_embedded_gateway();
    let cluster = |host: &str| cluster_section(&postgres, &nats, host);
    let config_before =
        std::fs::read_to_string(stack.state.root().join("agentworks.toml")).unwrap();
    append_config(&stack, &cluster("gw-a"));
    let mut gw = Gatewayd::start(&stack, port);
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let created = stack.admin(
        "tokens/create",
        json!({"user": "alice", "scopes": ["devices:connect"]}),
    );
    let token = created["token"].as_str().unwrap();
    let alice = created["info"]["user_id"].as_str().unwrap();
    let echo = echo_executor(port, token);
    let device_id = echo.device_id.clone();
    assert_eq!(
        postgres.psql(
            "agentworks",
            &format!(
                "SELECT user_id || ' ' || name FROM gateway_devices WHERE device_id = '{device_id}'"
            )
        ),
        format!("{alice} laptop")
    );
    let body = json!({"user_id": alice, "device_id": device_id, "folder": "proj",
                      "request_id": "req-shared", "operation":
                      {"kind": "execute_shell_command", "command": "echo hi", "timeout": 5}});
    let first = gw.client().json("/v1/dispatch", body.clone()).unwrap();
    assert_eq!(first["state"], "done", "{first}");
    assert_eq!(first["outcome"]["stdout"], "echo hi");
    assert_eq!(
        postgres.psql(
            "agentworks",
            "SELECT host_id || ' ' || state || ' ' || sent FROM gateway_requests \
             WHERE request_id = 'req-shared'"
        ),
        "gw-a done true"
    );
    // Nothing of it in SQLite: the shared database is the only store.
    assert!(!stack.state.root().join("gateway/gatewayd.db").exists());

    // The same id again, now through the same gatewayd restarted as another host: the record
    // answers, nothing is sent.
    assert!(gw.stop().success());
    std::fs::write(
        stack.state.root().join("agentworks.toml"),
        format!("{config_before}\n{}", cluster("gw-b")),
    )
    .unwrap();
    let gw = Gatewayd::start(&stack, port);
    let again_echo = echo_executor(port, token);
    assert_eq!(
        again_echo.device_id, device_id,
        "the device id lives in the shared database"
    );
    let again = gw.client().json("/v1/dispatch", body).unwrap();
    assert_eq!(again, first);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(echo.requests().len(), 1);
    assert_eq!(
        again_echo.requests().len(),
        0,
        "a recorded request id was re-sent"
    );
}

/// Runs gatewayd on `stack` until it exits (it must, within 30 s); returns its exit code and
/// stderr.
fn gatewayd_fails_to_start(stack: &Stack) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentworks-gatewayd"))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("AGENTWORKS_STATE_ROOT", stack.state.root())
        .env(
            "AGENTWORKS_CONFIG",
            stack.state.root().join("agentworks.toml"),
        )
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("gatewayd is still running on a configuration it must refuse");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn gatewayd_refuses_to_start_when_the_cluster_database_is_unreachable() {
    let (stack, _port) = Stack::start_with_embedded_gateway();
    let nobody = free_port();
    append_config(
        &stack,
        &format!(
            "[cluster]\ndatabase_url = \"postgres://gw:hunter2@127.0.0.1:{nobody}/agentworks\"\n\
             nats_url = \"nats://127.0.0.1:4222\"\nhost_id = \"gw-a\"\n"
        ),
    );
    let (code, stderr) = gatewayd_fails_to_start(&stack);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot open the gateway store"), "{stderr}");
    assert!(
        stderr.contains("cannot reach the cluster database"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("postgres://gw:***@127.0.0.1:{nobody}/agentworks")),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn gatewayd_refuses_a_half_configured_cluster() {
    let (stack, _port) = Stack::start_with_embedded_gateway();
    append_config(
        &stack,
        "[cluster]\ndatabase_url = \"postgres://gw@127.0.0.1:5432/agentworks\"\n",
    );
    let (code, stderr) = gatewayd_fails_to_start(&stack);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("cluster.database_url is set but cluster.nats_url is not"),
        "{stderr}"
    );
}

#[test]
fn a_revocation_on_nats_makes_gatewayd_recheck_the_token_and_close_it_within_a_second() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (stack, port) = Stack::start_with_embedded_gateway();
    // The periodic re-check once at start, then not for an hour: only NATS can wake gatewayd.
    append_config(
        &stack,
        &format!(
            "token_recheck_ms = 3600000\n[cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\n\
             host_id = \"gw-a\"\n",
            postgres.url(),
            nats.url()
        ),
    );
    let _gw = Gatewayd::start(&stack, port);
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let created = stack.admin(
        "tokens/create",
        json!({"user": "alice", "scopes": ["devices:connect"]}),
    );
    let (token, token_id) = (
        created["token"].as_str().unwrap(),
        created["info"]["id"].as_str().unwrap(),
    );
    let echo = echo_executor(port, token);
    let message = |token_id: &str| serde_json::to_vec(&json!({"token_id": token_id})).unwrap();

    // A message for a token agentd still accepts closes nothing (messages wake; agentd decides),
    // nor does a malformed one.
    nats.publish(REVOKED_SUBJECT, &message(token_id));
    nats.publish(REVOKED_SUBJECT, b"{\"token_id\": 7}");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(echo.closed(), None, "a valid token was closed");

    // Revoked in agentd: without a message nothing closes it for an hour...
    let out = stack.ctl(&["token", "revoke", token_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(echo.closed(), None);
    // ...and with one, within a second, with the revocation close code.
    let published = Instant::now();
    nats.publish(REVOKED_SUBJECT, &message(token_id));
    wait_until(
        "the revoked token's connection is closed",
        Duration::from_secs(5),
        || echo.closed().is_some(),
    );
    let (code, at) = echo.closed().unwrap();
    assert_eq!(code, Some(agentworks_contract::executor::CLOSE_REVOKED));
    let took = at - published;
    assert!(
        took < Duration::from_secs(1),
        "closed {took:?} after the message"
    );
}

#[test]
fn gatewayd_refuses_to_start_when_nats_is_unreachable_or_its_credentials_unusable() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (stack, _port) = Stack::start_with_embedded_gateway();
    let config = std::fs::read_to_string(stack.state.root().join("agentworks.toml")).unwrap();
    let with_cluster = |nats_url: &str, extra: &str| {
        std::fs::write(
            stack.state.root().join("agentworks.toml"),
            format!(
                "{config}\n[cluster]\ndatabase_url = \"{}\"\nnats_url = \"{nats_url}\"\n\
                 host_id = \"gw-a\"\n{extra}",
                postgres.url()
            ),
        )
        .unwrap();
    };
    let nobody = free_port();
    with_cluster(&format!("nats://127.0.0.1:{nobody}"), "");
    let (code, stderr) = gatewayd_fails_to_start(&stack);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot join the cluster's NATS server"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "cannot connect to NATS at nats://127.0.0.1:{nobody}"
        )),
        "{stderr}"
    );

    // A credentials file that is private but not NATS credentials.
    let creds = stack.state.root().join("nats.creds");
    std::fs::write(&creds, "not a credentials file\n").unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    with_cluster(&nats.url(), &format!("nats_credentials = {creds:?}\n"));
    let (code, stderr) = gatewayd_fails_to_start(&stack);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot use the NATS credentials file {}",
            creds.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("not a credentials file"), "{stderr}");
}
