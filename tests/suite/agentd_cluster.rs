//! agentd in cluster mode (issue 16), end to end: real workspaced, agentd and gatewayd, a real
//! PostgreSQL and nats-server from the harness, and the real laptop executor. A token revoked
//! through agentd's operator API is announced on NATS, and gatewayd closes the executor's
//! connection within a second, with its periodic re-check set to an hour so only the message
//! can explain it. agentd refuses to start in a cluster whose NATS server does not answer.
//! Two agentd hosts on one PostgreSQL share their identity: a token made through one is
//! accepted by the other, and revoked through the other it closes the executor on the first
//! host's gatewayd within a second. However many stores agentd keeps in the database, it holds
//! at most `MAX_CONNECTIONS` connections to it, under load too.

use super::agent::LaptopExt;
use super::harness::{
    Gatewayd, Laptop, Nats, Postgres, Stack, block_on, cluster_section, free_port, http, wait_until,
};
use agentworks_support::unix_http::UnixClient;
use serde_json::json;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Appends `text` to the stack's config file.
fn append_config(stack: &Stack, text: &str) {
    let path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{config}\n{text}")).unwrap();
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
    let mut executor = laptop.connect();
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
    while executor.child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            panic!("the executor is still running with a revoked token");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The config of a second agentd beside the stack's: the stack's file with its own public port
/// and socket, and `cluster` appended. Returns (config path, public port, socket).
fn second_agentd_config(
    stack: &Stack,
    cluster: &str,
) -> (std::path::PathBuf, u16, std::path::PathBuf) {
    let root = stack.state.root();
    let config = std::fs::read_to_string(root.join("agentworks.toml")).unwrap();
    let listen = format!("listen = \"127.0.0.1:{}\"", stack.port);
    assert!(config.contains(&listen), "{config}");
    let (port, socket) = (free_port(), root.join("run/agentd-b.sock"));
    // The stack's own [cluster], if any, is replaced by `cluster`.
    let config = config.split("\n[cluster]").next().unwrap().replace(
        &listen,
        &format!("listen = \"127.0.0.1:{port}\"\nsocket = {socket:?}"),
    );
    let path = root.join("agentd-b.toml");
    std::fs::write(&path, format!("{config}\n{cluster}")).unwrap();
    (path, port, socket)
}

#[test]
fn two_agentd_hosts_share_tokens_and_a_revocation_through_either_closes_the_executor() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (mut stack, gw_port) = Stack::start_with_embedded_gateway();
    let cluster = |host: &str| cluster_section(&postgres, &nats, host);
    append_config(
        &stack,
        &format!("token_recheck_ms = 3600000\n{}", cluster("host-a")),
    );
    stack.restart_agentd();
    let gw = Gatewayd::start(&stack, gw_port);
    let (config_b, port_b, socket_b) = second_agentd_config(&stack, &cluster("host-b"));
    let _agentd_b = stack.spawn_agentd(&config_b, Stdio::inherit());
    let admin_b = |endpoint: &str, body: serde_json::Value| {
        block_on(
            UnixClient::new(&socket_b)
                .post::<_, serde_json::Value>(&format!("/v1/admin/{endpoint}"), &body),
        )
    };
    wait_until(
        "agentd B answers on its socket",
        Duration::from_secs(20),
        || admin_b("users/list", json!({})).is_ok(),
    );

    // Made through A, in the shared database.
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let create = |scope: &str| {
        let created = stack.admin("tokens/create", json!({"user": "alice", "scopes": [scope]}));
        (
            created["token"].as_str().unwrap().to_owned(),
            created["info"]["id"].as_str().unwrap().to_owned(),
        )
    };
    let (token, token_id) = create("devices:connect");
    let (reader, reader_id) = create("workflows:read");
    // The rows are in PostgreSQL, not in the SQLite file both hosts' state root has (agentd A
    // used it before it joined the cluster): only the shared database can explain B's answers.
    assert_eq!(
        postgres.psql(
            "agentworks",
            &format!(
                "SELECT count(*) FROM agentd.tokens WHERE id IN ('{token_id}', '{reader_id}')"
            )
        ),
        "2"
    );
    let sqlite = rusqlite::Connection::open(stack.state.root().join("agent/agentd.db")).unwrap();
    let in_sqlite: i64 = sqlite
        .query_row("SELECT count(*) FROM users WHERE name = 'alice'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(in_sqlite, 0, "alice is not in the SQLite file");
    let users_b = admin_b("users/list", json!({})).unwrap();
    assert!(
        users_b.to_string().contains("alice"),
        "agentd B lists A's user: {users_b}"
    );
    let bearer = format!("Bearer {reader}");
    let projects = |port: u16| {
        http(
            port,
            "GET",
            "/v1/projects",
            &[("authorization", &bearer)],
            "",
        )
        .0
    };
    assert_eq!(
        projects(port_b),
        200,
        "agentd B accepts a token made through A"
    );

    let laptop = Laptop::new("aw-agentd-pair-", &[("src/repo/a.txt", "one\n")]);
    laptop.login(&stack, gw_port, &token);
    let _executor = laptop.connect();
    wait_until(
        "the executor is connected to gatewayd A",
        Duration::from_secs(20),
        || gw.connected() == 1,
    );

    // Revoked through B: A's gatewayd hears it on NATS (its re-check is an hour away).
    let revoked_at = Instant::now();
    admin_b("tokens/revoke", json!({"id": token_id})).unwrap();
    wait_until(
        "gatewayd A closes the revoked token's connection",
        Duration::from_secs(5),
        || gw.connected() == 0,
    );
    let took = revoked_at.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "closed {took:?} after the revocation through B"
    );
    admin_b("tokens/revoke", json!({"id": reader_id})).unwrap();
    assert_eq!(
        projects(stack.port),
        401,
        "agentd A refuses a token revoked through B"
    );
}

#[test]
fn agentd_refuses_to_start_in_a_cluster_whose_nats_does_not_answer() {
    let postgres = Postgres::start();
    let (stack, _gw_port) = Stack::start_with_embedded_gateway();
    let nobody = free_port();
    // A second agentd beside the running one: its own port and socket, the cluster added.
    let (path, _, _) = second_agentd_config(
        &stack,
        &format!(
            "[cluster]\ndatabase_url = \"{}\"\nnats_url = \"nats://127.0.0.1:{nobody}\"\n\
             host_id = \"host-a\"\n",
            postgres.url()
        ),
    );
    let mut agentd = stack.spawn_agentd(&path, Stdio::piped());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = agentd.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "agentd is still running in a cluster whose NATS does not answer"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut agentd.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
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

#[test]
fn agentd_holds_at_most_max_connections_to_the_database_under_load() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let port = free_port();
    let stack = Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\n{}",
            cluster_section(&postgres, &nats, "a-1")
        ),
    );
    let (workflow, token) = stack.user_with_project("alice", "demo", &["workflows:read"]);
    let agentd_connections = || {
        postgres
            .psql(
                "agentworks",
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agentworks-agentd'",
            )
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    // 32 callers at once, each call a token check (the identity store) and a file read.
    let most = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|scope| {
        for _ in 0..32 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let (status, body) = super::harness::mcp_call(
                        port,
                        &token,
                        "list_files",
                        json!({"workflow_id": workflow}),
                    );
                    assert_eq!(status, 200, "{body}");
                }
            });
        }
        scope.spawn(|| {
            for _ in 0..20 {
                most.fetch_max(agentd_connections(), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    });
    let most = most.into_inner().max(agentd_connections());
    let max = agentworks_daemon::postgres::MAX_CONNECTIONS;
    assert!(
        most <= max,
        "agentd held {most} connections to PostgreSQL at once; at most {max} are allowed"
    );
    assert!(most >= 1, "agentd was not seen connected at all");
}
