//! Device leases across two gatewayd hosts (issue 16), end to end: a [`GatewayPair`] (one real
//! PostgreSQL and nats-server, hosts `gw-a` and `gw-b`, a lease lasting 3 s unless renewed,
//! agentd's client for them over NATS), and a scripted executor that accepts every request and
//! answers none (so a request stays pending).
//!
//! A connected device's lease is this host's and visible from the other host; a disconnect
//! releases it; agentd's dispatch for the device on B runs on B, and its cancel reaches it
//! there; B killed with SIGKILL loses its leases within the expiry window, its pending request
//! reads `unknown` from A, and the dispatch agentd waits on ends as a lost answer, which its
//! recovery cannot settle while the device is away (never re-sent); the device shows offline,
//! and reconnecting to A keeps its id.

use super::harness::{FakeExecutor, GatewayPair, Reply, device_token, wait_until};
use agentworks_contract::executor::FolderAccess;
use agentworks_support::unix_http::UnixClient;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn silent_executor(port: u16, token: &str) -> FakeExecutor {
    let folders = [("proj", FolderAccess::ReadWrite)];
    FakeExecutor::connect(port, token, "laptop", &folders, Reply::Hang)
        .expect("the executor was refused")
}

#[test]
fn leases_follow_the_device_and_a_killed_host_loses_them_and_its_pending_requests() {
    let mut pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);

    // Connected to A: A's lease; a disconnect releases it.
    let on_a = silent_executor(pair.a.port, &token);
    let device_id = on_a.device_id.clone();
    assert_eq!(pair.lease_holder(&device_id), "gw-a");
    on_a.vanish();
    wait_until(
        "the lease is released at the disconnect",
        Duration::from_secs(5),
        || pair.lease_holder(&device_id).is_empty(),
    );

    // Connected to B: B's lease, and A lists the device online.
    let on_b = silent_executor(pair.b.port, &token);
    assert_eq!(on_b.device_id, device_id, "one device, whichever host");
    assert_eq!(pair.lease_holder(&device_id), "gw-b");
    let listed = pair
        .a
        .client()
        .json("/v1/devices", json!({"user_id": alice}))
        .unwrap();
    assert_eq!(listed[0]["device_id"], device_id.as_str(), "{listed}");
    assert_eq!(listed[0]["online"], true, "{listed}");
    // Still held by B after several renewals (3 s is one lease without them).
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(pair.lease_holder(&device_id), "gw-b");

    // agentd's dispatch runs on B, where it stays pending (the executor never answers).
    let body = json!({"user_id": alice, "device_id": device_id, "folder": "proj",
                      "request_id": "req-lost", "operation":
                      {"kind": "execute_shell_command", "command": "sleep 300", "timeout": 300}});
    let agentd = Arc::new(pair.agentd("ag-1"));
    let waiting = std::thread::spawn({
        let agentd = agentd.clone();
        move || agentd.json("/v1/dispatch", body)
    });
    on_b.wait_requests(1);
    wait_until(
        "the request is pending on B",
        Duration::from_secs(10),
        || pair.request_state("req-lost") == "gw-b pending",
    );
    // agentd's cancel reaches the executor through B (any host takes it; A names B).
    let cancelled = agentd
        .json(
            "/v1/cancel",
            json!({"user_id": alice, "request_id": "req-lost"}),
        )
        .unwrap();
    assert_eq!(cancelled["cancel_sent"], true, "{cancelled}");
    on_b.wait_for(Duration::from_secs(5), "the cancel", |seen| {
        (seen.cancels == ["req-lost"]).then_some(())
    });

    // B dies without a word: within the expiry window (three missed renewals, plus A's pass)
    // its lease is gone, its request reads unknown, and the dispatch agentd waits on says so.
    pair.b.child.kill().unwrap();
    let killed = Instant::now();
    let _ = pair.b.child.wait();
    wait_until(
        "B's lease expires and its request becomes unknown",
        Duration::from_secs(10),
        || {
            pair.lease_holder(&device_id).is_empty()
                && pair.request_state("req-lost") == "gw-b unknown"
        },
    );
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // agentd's dispatch ends as a lost answer (the turn then recovers it), naming the
    // record's reason; not a refusal that would say it was not sent.
    let (lost, _) = waiting
        .join()
        .unwrap()
        .expect_err("the dispatch answered without its holder");
    assert!(lost.contains("gave no answer"), "{lost}");
    assert!(lost.contains("lease"), "{lost}");
    assert!(
        killed.elapsed() < Duration::from_secs(7),
        "the dispatch answered {:?} after B died",
        killed.elapsed()
    );
    // Its recovery: nothing settles it while the device is away, and it is not re-sent.
    let recovery = agentd
        .json(
            "/v1/recover",
            json!({"user_id": alice, "device_id": device_id, "folder": "proj",
                   "request_id": "req-lost", "operation":
                   {"kind": "execute_shell_command", "command": "sleep 300", "timeout": 300}}),
        )
        .unwrap();
    assert_eq!(recovery["recovery"], "unsettled", "{recovery}");
    let outcome = pair
        .a
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-lost"}),
        )
        .unwrap();
    assert_eq!(outcome["state"], "unknown", "{outcome}");
    assert!(
        outcome["reason"].as_str().unwrap().contains("lease"),
        "{outcome}"
    );
    let listed = pair
        .a
        .client()
        .json("/v1/devices", json!({"user_id": alice}))
        .unwrap();
    assert_eq!(listed[0]["online"], false, "{listed}");
    assert_eq!(on_b.requests().len(), 1, "the request was re-sent");
    drop(on_b);

    // The device reconnects to A: the same id, A's lease.
    let back = silent_executor(pair.a.port, &token);
    assert_eq!(back.device_id, device_id);
    assert_eq!(pair.lease_holder(&device_id), "gw-a");
}

#[test]
fn a_host_killed_after_its_device_moved_away_still_loses_its_pending_requests() {
    let mut pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = silent_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();
    let body = json!({"user_id": alice, "device_id": device_id, "folder": "proj",
                      "request_id": "req-orphan", "operation":
                      {"kind": "execute_shell_command", "command": "sleep 300", "timeout": 300}});
    let socket_b = pair.b.socket.clone();
    std::thread::spawn(move || {
        // Ends with a transport error when B is killed; nothing waits for it.
        let client = UnixClient::new(&socket_b);
        let _ =
            super::harness::block_on(client.post::<_, serde_json::Value>("/v1/dispatch", &body));
    });
    on_b.wait_requests(1);
    assert_eq!(pair.request_state("req-orphan"), "gw-b pending");

    // B dies and the device is on A at once, before B's lease could expire: A takes the lease
    // over, so no lease of B's is left to expire. B's own heartbeat lapsing still marks it lost.
    pair.b.child.kill().unwrap();
    let killed = Instant::now();
    let _ = pair.b.child.wait();
    let on_a = silent_executor(pair.a.port, &token);
    assert_eq!(on_a.device_id, device_id);
    assert_eq!(pair.lease_holder(&device_id), "gw-a");
    wait_until(
        "the dead host's pending request becomes unknown",
        Duration::from_secs(10),
        || pair.request_state("req-orphan") == "gw-b unknown",
    );
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(pair.lease_holder(&device_id), "gw-a", "A's lease survived");
    assert!(on_a.requests().is_empty(), "the request was re-sent");
}
