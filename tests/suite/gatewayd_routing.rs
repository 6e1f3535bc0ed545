//! agentd dispatching to gatewayd hosts over NATS (issue 16), end to end: a [`GatewayPair`]
//! (real PostgreSQL and nats-server, hosts `gw-a` and `gw-b`), a scripted executor connected to
//! B that echoes every command, and agentd's own client for the gateways ([`ClusterAgentd`],
//! two of them: agentd hosts `ag-1` and `ag-2`).
//!
//! A dispatch runs on B's executor and its result comes back; the same request id dispatched
//! by two agentd hosts at once, many times, reaches the executor once (the caller that claimed
//! it gets the outcome, any other is told it is pending); a call on A's socket for the device
//! on B is refused with B's id, never passed on; a forged call on B's subject (no MAC, or a MAC
//! under another key) sends nothing; a holder that hears a dispatch and never records it (a
//! silent host the test stands in for) has its id claimed as never sent, so it never runs
//! later, after ten seconds or as soon as that host loses the device.

use std::sync::Arc;

use super::harness::{ClusterAgentd, FakeExecutor, GatewayPair, Reply, device_token};
use agentworks_contract::cluster::{PEER_MAC_HEADER, PeerCall, gateway_subject};
use agentworks_contract::executor::FolderAccess;
use agentworks_gateway::agentd_calls::GatewaydKey;
use serde_json::{Value, json};

fn echo_executor(port: u16, token: &str) -> FakeExecutor {
    let folders = [("proj", FolderAccess::ReadWrite)];
    FakeExecutor::connect(port, token, "laptop", &folders, Reply::Echo)
        .expect("the executor was refused")
}

fn dispatch_body(user_id: &str, device_id: &str, request_id: &str, command: &str) -> Value {
    json!({"user_id": user_id, "device_id": device_id, "folder": "proj",
           "request_id": request_id, "operation":
           {"kind": "execute_shell_command", "command": command, "timeout": 5}})
}

#[test]
fn a_dispatch_runs_on_the_host_holding_the_device_and_an_id_runs_once() {
    let pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = echo_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();
    assert_eq!(pair.lease_holder(&device_id), "gw-b");
    let (one, two) = (Arc::new(pair.agentd("ag-1")), Arc::new(pair.agentd("ag-2")));

    // From agentd host 1: sent by B (its record), answered to agentd.
    let body = dispatch_body(&alice, &device_id, "req-routed", "echo routed");
    let answered = one.json("/v1/dispatch", body.clone()).unwrap();
    assert_eq!(answered["state"], "done", "{answered}");
    assert_eq!(answered["outcome"]["stdout"], "echo routed", "{answered}");
    assert_eq!(pair.request_state("req-routed"), "gw-b done");
    // Again from both agentd hosts, and on B's socket: answered from the record, not sent again.
    assert_eq!(one.json("/v1/dispatch", body.clone()).unwrap(), answered);
    assert_eq!(two.json("/v1/dispatch", body.clone()).unwrap(), answered);
    assert_eq!(
        pair.b.client().json("/v1/dispatch", body).unwrap(),
        answered
    );
    // The outcome and the device are readable on any host.
    let outcome = two
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-routed"}),
        )
        .unwrap();
    assert_eq!(outcome, answered);
    let devices = one.json("/v1/devices", json!({"user_id": alice})).unwrap();
    assert_eq!(devices[0]["device_id"], device_id.as_str(), "{devices}");
    assert_eq!(devices[0]["online"], true, "{devices}");
    // Another person asking for this device: not found, as on one host.
    let (_, _, bob) = device_token(&pair.stack, "bob", &["devices:connect"]);
    let (code, _) = one
        .json(
            "/v1/dispatch",
            dispatch_body(&bob, &device_id, "req-bob", "echo bob"),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
    // Nor does the watch agentd reads say where another person's device is connected.
    let watch = |user: &str| {
        one.json(
            "/v1/watch",
            dispatch_body(user, &device_id, "req-watched", "echo w"),
        )
        .unwrap()
    };
    assert_eq!(watch(&alice)["holder"], "gw-b");
    assert_eq!(watch(&bob)["holder"], Value::Null);
    // gatewayd never passes a call on: A's socket names the holder instead.
    let (code, error) = pair
        .a
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(&alice, &device_id, "req-on-a", "echo a"),
        )
        .unwrap_err();
    assert_eq!(code, "device_on_other_host", "{error}");
    assert_eq!(error["host_id"], "gw-b", "{error}");

    // One id, sixteen callers at once, half through each agentd host: the executor sees it
    // once and every caller gets that one outcome.
    let body = dispatch_body(&alice, &device_id, "req-raced", "echo raced");
    let callers: Vec<_> = (0..16)
        .map(|i| {
            let agentd = if i % 2 == 0 { one.clone() } else { two.clone() };
            let body = body.clone();
            std::thread::spawn(move || {
                agentd
                    .json("/v1/dispatch", body)
                    .expect("a dispatch failed")
            })
        })
        .collect();
    let answers: Vec<Value> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    // Whoever claimed the id waits for its result; a caller that came while it ran is told it
    // is pending (agentd reports that as outcome_unknown), as on one host; none runs it again.
    for answer in &answers {
        let done = answer["state"] == "done" && answer["outcome"]["stdout"] == "echo raced";
        assert!(done || answer["state"] == "pending", "{answer}");
    }
    assert!(answers.iter().any(|a| a["state"] == "done"), "{answers:?}");
    let recorded = one
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-raced"}),
        )
        .unwrap();
    assert_eq!(recorded["outcome"]["stdout"], "echo raced", "{recorded}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-routed", "req-raced"], "an id was sent twice");
}

fn agentd_of(pair: &GatewayPair) -> ClusterAgentd {
    pair.agentd("ag-1")
}

#[test]
fn a_forged_call_sends_nothing() {
    let pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = echo_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();
    let call = |request_id: &str| {
        let body = dispatch_body(&alice, &device_id, request_id, "echo forged").to_string();
        serde_json::to_vec(&PeerCall {
            origin: "gw-a".into(),
            sent_at_ms: agentworks_support::clock::now_ms(),
            path: "/v1/dispatch".into(),
            body,
        })
        .unwrap()
    };
    // Well-formed calls that would run on B if B acted on any call it hears: without a MAC,
    // and with one under a key that is not the cluster's.
    let subject = gateway_subject("gw-b");
    pair.nats.publish(&subject, &call("req-forged-1"));
    let forged = call("req-forged-2");
    let wrong_key = GatewaydKey::new([9; 32]).seal(&subject, &forged);
    pair.nats
        .publish_with_headers(&subject, &[(PEER_MAC_HEADER, &wrong_key)], &forged);

    // A real call afterwards runs. The server handled the forged ones first (each
    // publication waits for its PONG) and B reads its subject in order, dropping each at once,
    // so by the time this call is answered they were read.
    let body = dispatch_body(&alice, &device_id, "req-real", "echo real");
    let answered = agentd_of(&pair).json("/v1/dispatch", body).unwrap();
    assert_eq!(answered["state"], "done", "{answered}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-real"], "a forged call was sent to the device");
    assert_eq!(pair.request_state("req-forged-1"), "");
    assert_eq!(pair.request_state("req-forged-2"), "");
}

/// The device of a fresh executor, disconnected again, and then "held" by host `gw-c`, which
/// nobody runs: its lease and its heartbeat far in the future, and the test listening on its
/// subject, hearing every call and answering none (as a host that froze or died with the call).
fn held_by_a_silent_host(
    pair: &GatewayPair,
    token: &str,
) -> (String, async_nats::Subscriber, tokio::runtime::Runtime) {
    let gone = echo_executor(pair.a.port, token);
    let device_id = gone.device_id.clone();
    gone.vanish();
    super::harness::wait_until(
        "the lease is released at the disconnect",
        std::time::Duration::from_secs(5),
        || pair.lease_holder(&device_id).is_empty(),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let calls = runtime.block_on(async {
        let client = async_nats::connect(pair.nats.url()).await.unwrap();
        let calls = client.subscribe(gateway_subject("gw-c")).await.unwrap();
        client.flush().await.unwrap();
        calls
    });
    let far = agentworks_support::clock::now_ms() + 3_600_000;
    pair.postgres.psql(
        "agentworks",
        &format!(
            "INSERT INTO gateway_hosts (host_id, alive_until_ms) VALUES ('gw-c', {far}); \
             INSERT INTO gateway_leases (device_id, host_id, expires_at_ms) \
             VALUES ('{device_id}', 'gw-c', {far})"
        ),
    );
    (device_id, calls, runtime)
}

/// Waits until the silent host hears a call to `path`.
fn heard(runtime: &tokio::runtime::Runtime, calls: &mut async_nats::Subscriber, path: &str) {
    use futures_util::StreamExt;
    runtime.block_on(async {
        loop {
            let message = tokio::time::timeout(std::time::Duration::from_secs(20), calls.next())
                .await
                .expect("the silent host heard no call")
                .unwrap();
            let call: PeerCall = serde_json::from_slice(&message.payload).unwrap();
            if call.path == path {
                return;
            }
        }
    });
}

#[test]
fn a_dispatch_the_holder_never_recorded_is_claimed_and_never_runs_later() {
    let pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let (device_id, mut calls, runtime) = held_by_a_silent_host(&pair, &token);

    // The holder hears the dispatch and records nothing: agentd claims the id as never sent
    // after ten seconds, and says so.
    let agentd = Arc::new(agentd_of(&pair));
    let body = dispatch_body(&alice, &device_id, "req-frozen", "echo frozen");
    let waiting = std::thread::spawn({
        let (agentd, body) = (agentd.clone(), body.clone());
        move || agentd.json("/v1/dispatch", body)
    });
    heard(&runtime, &mut calls, "/v1/dispatch");
    let (code, error) = waiting.join().unwrap().unwrap_err();
    assert_eq!(code, "gateway_host_unavailable", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("within 10 s"), "{error}");
    assert!(message.contains("never will be"), "{error}");
    assert_eq!(
        pair.request_state("req-frozen").split(' ').nth(1),
        Some("unknown")
    );

    // The device comes back on B, and the lost call reaches B after all: B finds the claim and
    // sends nothing. A new request runs: the executor saw only that one.
    pair.postgres.psql(
        "agentworks",
        &format!("DELETE FROM gateway_leases WHERE device_id = '{device_id}'"),
    );
    let on_b = echo_executor(pair.b.port, &token);
    assert_eq!(on_b.device_id, device_id);
    let again = pair.b.client().json("/v1/dispatch", body).unwrap();
    assert_eq!(again["state"], "unknown", "{again}");
    let ran = dispatch_body(&alice, &device_id, "req-after", "echo after");
    let after = agentd.json("/v1/dispatch", ran).unwrap();
    assert_eq!(after["state"], "done", "{after}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-after"], "the claimed request was sent");
}

#[test]
fn a_dispatch_to_a_holder_that_loses_the_device_before_recording_it_fails_without_waiting() {
    let pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let (device_id, mut calls, runtime) = held_by_a_silent_host(&pair, &token);

    // The holder hears the dispatch, records nothing, and its lease ends (as when a dead host's
    // lease expires): agentd stops waiting when it sees that, not after ten seconds.
    let agentd = Arc::new(agentd_of(&pair));
    let body = dispatch_body(&alice, &device_id, "req-dying", "echo dying");
    let waiting = std::thread::spawn({
        let agentd = agentd.clone();
        move || agentd.json("/v1/dispatch", body)
    });
    heard(&runtime, &mut calls, "/v1/dispatch");
    pair.postgres.psql(
        "agentworks",
        &format!("DELETE FROM gateway_leases WHERE device_id = '{device_id}'"),
    );
    let (code, error) = waiting
        .join()
        .unwrap()
        .expect_err("the dispatch succeeded without its holder");
    assert_eq!(code, "gateway_host_unavailable", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("before it lost the device"),
        "{error}"
    );
    assert_eq!(
        pair.request_state("req-dying").split(' ').nth(1),
        Some("unknown")
    );
}
