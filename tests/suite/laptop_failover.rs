//! Failover between gateways (issue 16) with the real `agentworks executor connect` given
//! several: a first gateway nothing listens on is skipped for the next at once (the list stored
//! by `agentworks login`), and a gateway killed with SIGKILL while the executor is connected to
//! it is left for the next one, which serves the same device. For the second, the two gatewayd
//! hosts form a cluster (the harness's PostgreSQL and nats-server), so the device keeps its id
//! whichever host holds it. Dispatches go through each gatewayd's own socket, as agentd's do.

use super::harness::{
    ExecutorProcess, Gatewayd, Laptop, Nats, Person, Postgres, Stack, cluster_section, free_port,
    start_gatewayd_host,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// How long a bounded wait may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// `ws://127.0.0.1:<port>`, as `--gateway` takes it.
fn ws(port: u16) -> String {
    format!("ws://127.0.0.1:{port}")
}

/// The endpoint the executor dials for a `--gateway` URL, as its status lines name it.
fn endpoint(port: u16) -> String {
    format!("{}/v1/executor", ws(port))
}

/// A laptop sharing one folder, `~/src/repo`.
fn repo_laptop() -> Laptop {
    Laptop::new("aw-failover-", &[("src/repo/a.txt", "one\n")])
}

/// `--name laptop --write-folder ~/src/repo`, then `extra`.
fn share_repo(laptop: &Laptop, extra: &[String]) -> Vec<String> {
    let mut args = vec![
        "--name".to_owned(),
        "laptop".to_owned(),
        "--write-folder".to_owned(),
        laptop.folder("repo").to_str().unwrap().to_owned(),
    ];
    args.extend_from_slice(extra);
    args
}

/// The id of `person`'s device once `gw` lists it online.
fn wait_online(executor: &mut ExecutorProcess, gw: &Gatewayd, person: &Person) -> String {
    let mut device_id = String::new();
    executor.wait_until("the device is online", WAIT, || {
        let listed = gw
            .client()
            .json("/v1/devices", json!({"user_id": person.user_id}))
            .unwrap();
        let online = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["online"] == true);
        if let Some(device) = online {
            device_id = device["device_id"].as_str().unwrap().to_owned();
        }
        online.is_some()
    });
    device_id
}

/// `echo <word>` on the device through `gw`: asserts it completed and printed `word`.
fn echo_through(gw: &Gatewayd, person: &Person, device_id: &str, request_id: &str, word: &str) {
    let body = json!({"user_id": person.user_id, "device_id": device_id, "folder": "repo",
                      "request_id": request_id, "operation":
                      {"kind": "execute_shell_command", "command": format!("echo {word}")}});
    let answer: Value = gw
        .client()
        .json("/v1/dispatch", body)
        .unwrap_or_else(|e| panic!("the dispatch was refused: {e:?}"));
    assert_eq!(answer["state"], "done", "{answer}");
    assert_eq!(answer["outcome"]["status"], "completed", "{answer}");
    assert_eq!(answer["outcome"]["stdout"], format!("{word}\n"), "{answer}");
}

#[test]
fn a_first_gateway_nobody_listens_on_is_skipped_for_the_next_at_once() {
    let (stack, gw_port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, gw_port);
    let alice = stack.person("alice");
    // Reserved for this test process and never bound: nothing listens there.
    let nobody = free_port();
    let laptop = repo_laptop();
    laptop.login_to(&stack, &[&ws(nobody), &ws(gw_port)], &alice.token);
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(laptop.credentials()).unwrap()).unwrap();
    assert_eq!(
        stored["gateways"],
        json!([ws(nobody), ws(gw_port)]),
        "{stored}"
    );

    // No --gateway: the list stored at login, in its order.
    let mut executor = laptop.executor_connect(&share_repo(&laptop, &[]), &[]);
    let device_id = wait_online(&mut executor, &gw, &alice);
    echo_through(&gw, &alice, &device_id, "req-second", "via-the-second");
    let stderr = executor.stderr();
    assert!(
        stderr.contains(&format!("connecting to {} …", endpoint(nobody))),
        "{stderr}"
    );
    // The next gateway at once: no wait within the round.
    let failover = format!("; trying {} …", endpoint(gw_port));
    assert!(
        stderr.lines().any(|line| line
            .starts_with(&format!("gateway {} lost (", endpoint(nobody)))
            && line.ends_with(&failover)),
        "{stderr}"
    );
}

/// Two gatewayd hosts in a cluster (the harness's PostgreSQL and nats-server), A the stack's
/// and B beside it; with `advertise`, both tell executors of both (`advertised_urls`).
struct TwoHosts {
    _servers: (Postgres, Nats),
    stack: Stack,
    gw_a: Gatewayd,
    gw_b: Gatewayd,
    port_a: u16,
    port_b: u16,
}

fn two_hosts(advertise: bool) -> TwoHosts {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (stack, port_a) = Stack::start_with_embedded_gateway();
    let port_b = free_port();
    let path = stack.state.root().join("agentworks.toml");
    let mut config = std::fs::read_to_string(&path).unwrap();
    if advertise {
        let listen = format!("listen = \"127.0.0.1:{port_a}\"");
        assert!(config.contains(&listen), "{config}");
        config = config.replace(
            &listen,
            &format!(
                "{listen}\nadvertised_urls = [\"{}\", \"{}\"]",
                ws(port_a),
                ws(port_b)
            ),
        );
    }
    std::fs::write(
        &path,
        format!("{config}{}", cluster_section(&postgres, &nats, "gw-a")),
    )
    .unwrap();
    let gw_a = Gatewayd::start(&stack, port_a);
    let gw_b = start_gatewayd_host(
        &stack,
        port_a,
        port_b,
        "gatewayd-b",
        &[("host_id = \"gw-a\"", "host_id = \"gw-b\"")],
    );
    TwoHosts {
        _servers: (postgres, nats),
        stack,
        gw_a,
        gw_b,
        port_a,
        port_b,
    }
}

#[test]
fn a_gateway_killed_under_the_executor_is_left_for_the_next_which_serves_the_device() {
    let TwoHosts {
        _servers,
        stack,
        mut gw_a,
        gw_b,
        port_a,
        port_b,
    } = two_hosts(false);
    let alice = stack.person("alice");
    let laptop = repo_laptop();
    laptop.login(&stack, port_a, &alice.token);

    // --gateway, repeated, in failover order (it replaces the one stored at login).
    let gateways = [
        "--gateway".to_owned(),
        ws(port_a),
        "--gateway".to_owned(),
        ws(port_b),
    ];
    let mut executor = laptop.executor_connect(&share_repo(&laptop, &gateways), &[]);
    let device_id = wait_online(&mut executor, &gw_a, &alice);
    assert_eq!(gw_a.connected(), 1);
    echo_through(&gw_a, &alice, &device_id, "req-on-a", "via-a");

    gw_a.child.kill().unwrap();
    let killed = Instant::now();
    let _ = gw_a.child.wait();
    executor.wait_until("the executor is connected to B", WAIT, || {
        gw_b.connected() == 1
    });
    let took = killed.elapsed();
    // The socket's end is seen at once and B is dialled without a wait.
    assert!(
        took < Duration::from_secs(5),
        "reconnected to B {took:?} after A died:\n{}",
        executor.stderr()
    );
    // The same device, now through B.
    echo_through(&gw_b, &alice, &device_id, "req-on-b", "via-b");
    let stderr = executor.stderr();
    assert!(
        stderr.lines().any(|line| {
            line.starts_with(&format!("gateway {} lost (", endpoint(port_a)))
                && line.ends_with(&format!("; trying {} …", endpoint(port_b)))
        }),
        "{stderr}"
    );
}

/// The laptop is given gateway A alone; the server advertises A and B in its welcome. A is
/// killed: the executor goes to B, which it learnt of only from the server, and serves the same
/// device there.
#[test]
fn a_gateway_the_server_advertised_is_where_the_executor_fails_over_to() {
    let TwoHosts {
        _servers,
        stack,
        mut gw_a,
        gw_b,
        port_a,
        port_b,
    } = two_hosts(true);
    let alice = stack.person("alice");
    let laptop = repo_laptop();
    laptop.login(&stack, port_a, &alice.token);
    let only_a = ["--gateway".to_owned(), ws(port_a)];
    let mut executor = laptop.executor_connect(&share_repo(&laptop, &only_a), &[]);
    let device_id = wait_online(&mut executor, &gw_a, &alice);
    // The gateway lists the device before the executor has read its welcome, and the list of
    // gateways is in that welcome: wait until the executor says it was welcomed.
    let deadline = Instant::now() + WAIT;
    while !executor.stderr().contains("connected as device") {
        assert!(
            Instant::now() < deadline,
            "never welcomed:\n{}",
            executor.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    gw_a.child.kill().unwrap();
    let _ = gw_a.child.wait();
    executor.wait_until("the executor is connected to B", WAIT, || {
        gw_b.connected() == 1
    });
    echo_through(&gw_b, &alice, &device_id, "req-advertised", "via-b");
    let stderr = executor.stderr();
    assert!(
        stderr.contains(&format!("; trying {} …", endpoint(port_b))),
        "{stderr}"
    );
}
