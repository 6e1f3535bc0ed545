//! agentd in cluster mode (issue 16), end to end: real workspaced, agentd and gatewayd, a real
//! PostgreSQL and nats-server from the harness, and the real laptop executor. A token revoked
//! through agentd's operator API is announced on NATS, and gatewayd closes the executor's
//! connection within a second, with its periodic re-check set to an hour so only the message
//! can explain it. agentd refuses to start in a cluster whose NATS server does not answer.

use super::harness::{Gatewayd, Laptop, Nats, Postgres, Stack, free_port, wait_until};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Appends `text` to the stack's config file.
fn append_config(stack: &Stack, text: &str) {
    let path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{config}\n{text}")).unwrap();
}

/// A child process killed and reaped on drop (also when the test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_token_revoked_through_agentd_closes_its_executor_on_gatewayd_within_a_second() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (mut stack, gw_port) = Stack::start_with_embedded_gateway();
    // gatewayd re-checks tokens once at start, then not for an hour: only NATS can wake it.
    append_config(
        &stack,
        &format!(
            "token_recheck_ms = 3600000\n[cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\n\
             host_id = \"host-a\"\n",
            postgres.url(),
            nats.url()
        ),
    );
    // agentd again, now in the cluster (it joins NATS before it answers).
    stack.restart_agentd();
    let gw = Gatewayd::start(&stack, gw_port);
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let created = stack.admin(
        "tokens/create",
        json!({"user": "alice", "scopes": ["devices:connect"]}),
    );
    let (token, token_id) = (
        created["token"].as_str().unwrap(),
        created["info"]["id"].as_str().unwrap(),
    );
    let laptop = Laptop::new("aw-agentd-cluster-", &[("src/repo/a.txt", "one\n")]);
    laptop.login(&stack, gw_port, token);
    let repo = laptop.folder("repo");
    let mut executor = Killed(
        laptop
            .command(&[
                "executor",
                "connect",
                "--name",
                "laptop",
                "--write-folder",
                repo.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    wait_until(
        "the executor is connected to gatewayd",
        Duration::from_secs(20),
        || gw.connected() == 1,
    );

    let revoked_at = Instant::now();
    stack.admin("tokens/revoke", json!({"id": token_id}));
    wait_until(
        "gatewayd closes the revoked token's connection",
        Duration::from_secs(5),
        || gw.connected() == 0,
    );
    let took = revoked_at.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "closed {took:?} after the revocation"
    );
    // The executor learns it was revoked and stops rather than reconnecting forever.
    let deadline = Instant::now() + Duration::from_secs(20);
    while executor.0.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            panic!("the executor is still running with a revoked token");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agentd_refuses_to_start_in_a_cluster_whose_nats_does_not_answer() {
    let postgres = Postgres::start();
    let (stack, _gw_port) = Stack::start_with_embedded_gateway();
    let nobody = free_port();
    // A second agentd beside the running one: its own port and socket, the cluster added.
    let root = stack.state.root();
    let config = std::fs::read_to_string(root.join("agentworks.toml")).unwrap();
    let listen = format!("listen = \"127.0.0.1:{}\"", stack.port);
    assert!(config.contains(&listen), "{config}");
    let config = config.replace(
        &listen,
        &format!(
            "listen = \"127.0.0.1:{}\"\nsocket = {:?}",
            free_port(),
            root.join("run/agentd-b.sock")
        ),
    );
    let path = root.join("agentd-b.toml");
    std::fs::write(
        &path,
        format!(
            "{config}\n[cluster]\ndatabase_url = \"{}\"\nnats_url = \"nats://127.0.0.1:{nobody}\"\n\
             host_id = \"host-a\"\n",
            postgres.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentworks-agentd"))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("AGENTWORKS_STATE_ROOT", root)
        .env("AGENTWORKS_CONFIG", &path)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agentd is still running in a cluster whose NATS does not answer");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
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
}
