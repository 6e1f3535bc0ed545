//! Dispatch routed between gatewayd hosts over NATS (issue 16), end to end: a [`GatewayPair`]
//! (real PostgreSQL and nats-server, hosts `gw-a` and `gw-b`, one agentd) and a scripted
//! executor connected to B that echoes every command.
//!
//! A dispatch made on A's socket runs on B's executor and its result comes back through A; the
//! same request id dispatched through A and B at once, many times, reaches the executor once
//! (the caller that claimed it gets the outcome, any other is told it is pending); a forged peer call on B's subject (no MAC, or a MAC
//! under another key) sends nothing.

use super::harness::{FakeExecutor, GatewayPair, Reply, device_token};
use agentworks_contract::cluster::{PEER_MAC_HEADER, PeerCall, peer_subject};
use agentworks_contract::executor::FolderAccess;
use agentworks_gateway::peers::PeerKey;
use agentworks_support::unix_http::UnixClient;
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
fn a_dispatch_on_one_host_runs_on_the_host_holding_the_device_and_an_id_runs_once() {
    let pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = echo_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();
    assert_eq!(pair.lease_holder(&device_id), "gw-b");

    // Through A: sent by B (its record), answered through A.
    let body = dispatch_body(&alice, &device_id, "req-routed", "echo routed");
    let answered = pair.a.client().json("/v1/dispatch", body.clone()).unwrap();
    assert_eq!(answered["state"], "done", "{answered}");
    assert_eq!(answered["outcome"]["stdout"], "echo routed", "{answered}");
    assert_eq!(pair.request_state("req-routed"), "gw-b done");
    // Again through A, and through B: answered from the record, not sent again.
    assert_eq!(
        pair.a.client().json("/v1/dispatch", body.clone()).unwrap(),
        answered
    );
    assert_eq!(
        pair.b.client().json("/v1/dispatch", body).unwrap(),
        answered
    );
    // The outcome and the device are readable through either host.
    let outcome = pair
        .a
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-routed"}),
        )
        .unwrap();
    assert_eq!(outcome, answered);
    // Another person asking through A for this device: not found, as on one host.
    let (_, _, bob) = device_token(&pair.stack, "bob", &["devices:connect"]);
    let (code, _) = pair
        .a
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(&bob, &device_id, "req-bob", "echo bob"),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");

    // One id, sixteen callers at once, half through each host: the executor sees it once and
    // every caller gets that one outcome.
    let body = dispatch_body(&alice, &device_id, "req-raced", "echo raced");
    let callers: Vec<_> = (0..16)
        .map(|i| {
            let socket = if i % 2 == 0 {
                pair.a.socket.clone()
            } else {
                pair.b.socket.clone()
            };
            let body = body.clone();
            std::thread::spawn(move || {
                let client = UnixClient::new(&socket);
                super::harness::block_on(client.post::<_, Value>("/v1/dispatch", &body))
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
    let recorded = pair
        .b
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-raced"}),
        )
        .unwrap();
    assert_eq!(recorded["outcome"]["stdout"], "echo raced", "{recorded}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-routed", "req-raced"], "an id was sent twice");
}

#[test]
fn a_forged_peer_call_sends_nothing() {
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
    let subject = peer_subject("gw-b");
    pair.nats.publish(&subject, &call("req-forged-1"));
    let forged = call("req-forged-2");
    let wrong_key = PeerKey::new([9; 32]).seal(&subject, &forged);
    pair.nats
        .publish_with_headers(&subject, &[(PEER_MAC_HEADER, &wrong_key)], &forged);

    // A real routed call afterwards runs. The server handled the forged ones first (each
    // publication waits for its PONG) and B reads its subject in order, dropping each at once,
    // so by the time this call is answered they were read.
    let body = dispatch_body(&alice, &device_id, "req-real", "echo real");
    let answered = pair.a.client().json("/v1/dispatch", body).unwrap();
    assert_eq!(answered["state"], "done", "{answered}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-real"], "a forged call was sent to the device");
    assert_eq!(pair.request_state("req-forged-1"), "");
    assert_eq!(pair.request_state("req-forged-2"), "");
}

#[test]
fn a_routed_call_the_holder_never_recorded_is_claimed_and_never_runs_later() {
    // A heartbeat of 5 s: B frozen for a dozen seconds keeps its lease and its executor.
    let pair = GatewayPair::start_with_heartbeat(5);
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = echo_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();

    // B freezes (SIGSTOP): the call reaches its socket but B records nothing. A claims the id
    // as never sent after ten seconds and says so.
    let b = nix::unistd::Pid::from_raw(pair.b.child.id() as i32);
    nix::sys::signal::kill(b, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let body = dispatch_body(&alice, &device_id, "req-frozen", "echo frozen");
    let started = std::time::Instant::now();
    let refused = pair.a.client().json("/v1/dispatch", body.clone());
    let took = started.elapsed();
    nix::sys::signal::kill(b, nix::sys::signal::Signal::SIGCONT).unwrap();
    let (code, error) = refused.unwrap_err();
    assert_eq!(code, "gateway_host_unavailable", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("never will be"),
        "{error}"
    );
    assert!(took < std::time::Duration::from_secs(13), "took {took:?}");

    // B thaws and reads the call: it finds the claim and sends nothing. The next call, made
    // after it (NATS delivers B's subject in order), runs: the executor saw only that one.
    let ran = dispatch_body(&alice, &device_id, "req-after", "echo after");
    let after = pair.a.client().json("/v1/dispatch", ran).unwrap();
    assert_eq!(after["state"], "done", "{after}");
    let again = pair.b.client().json("/v1/dispatch", body).unwrap();
    assert_eq!(again["state"], "unknown", "{again}");
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(sent, ["req-after"], "the claimed request was sent");
}

#[test]
fn a_routed_call_to_a_holder_that_loses_the_device_before_recording_it_fails_at_once() {
    let pair = GatewayPair::start_with_heartbeat(5);
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let on_b = echo_executor(pair.b.port, &token);
    let device_id = on_b.device_id.clone();

    // B freezes as the call goes out (it records nothing), and its lease ends (as when a dead
    // host's lease expires): A stops waiting at its next look, well before ten seconds.
    let b = nix::unistd::Pid::from_raw(pair.b.child.id() as i32);
    nix::sys::signal::kill(b, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let body = dispatch_body(&alice, &device_id, "req-dying", "echo dying");
    let socket_a = pair.a.socket.clone();
    let started = std::time::Instant::now();
    let waiting = std::thread::spawn(move || {
        let client = UnixClient::new(&socket_a);
        super::harness::block_on(client.post::<_, Value>("/v1/dispatch", &body))
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    pair.postgres.psql(
        "agentworks",
        &format!("DELETE FROM gateway_leases WHERE device_id = '{device_id}'"),
    );
    let answer = waiting.join().unwrap();
    let took = started.elapsed();
    nix::sys::signal::kill(b, nix::sys::signal::Signal::SIGCONT).unwrap();
    let error = answer.expect_err("the dispatch succeeded without its holder");
    assert!(
        error.to_string().contains("gateway_host_unavailable"),
        "{error}"
    );
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
    assert_eq!(pair.request_state("req-dying"), "gw-a unknown");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(on_b.requests().is_empty(), "the claimed request was sent");
}
