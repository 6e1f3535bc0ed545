//! gatewayd end to end: real workspaced, agentd and gatewayd processes on a temp state root, and
//! a fake executor (tokio-tungstenite, scripted) standing in for `agentworks executor connect`.

use super::harness::{
    FakeExecutor, Gatewayd, Reply, Stack, device_token, dial, ensure_user, http, users_lock,
};
use agentworks_contract::executor::FolderAccess;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn shell(command: &str, timeout: Option<u64>) -> Value {
    json!({"kind": "execute_shell_command", "command": command, "timeout": timeout})
}

fn dispatch_body(
    user_id: &str,
    device_id: &str,
    folder: &str,
    request_id: &str,
    op: Value,
) -> Value {
    json!({"user_id": user_id, "device_id": device_id, "folder": folder,
           "request_id": request_id, "operation": op})
}

const RW: FolderAccess = FolderAccess::ReadWrite;

#[test]
fn a_devices_connect_token_connects_and_only_its_owner_sees_the_device() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let (_, _, bob) = device_token(&stack, "bob", &["devices:connect"]);
    let fake =
        FakeExecutor::connect(port, &token, "alice-laptop", &[("proj", RW)], Reply::Echo).unwrap();

    let listed = gw
        .client()
        .json("/v1/devices", json!({"user_id": alice}))
        .unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["device_id"], fake.device_id.as_str());
    assert_eq!(listed[0]["name"], "alice-laptop");
    assert_eq!(listed[0]["online"], true);
    assert_eq!(listed[0]["folders"][0]["alias"], "proj");
    assert_eq!(listed[0]["folders"][0]["access"], "read_write");

    // Bob sees nothing, cannot dispatch to it, and cannot read Alice's outcomes.
    let bobs = gw
        .client()
        .json("/v1/devices", json!({"user_id": bob}))
        .unwrap();
    assert_eq!(bobs, json!([]));
    let (code, _) = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(&bob, &fake.device_id, "proj", "bob-1", shell("id", None)),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
    let done = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &fake.device_id,
                "proj",
                "alice-1",
                shell("id", None),
            ),
        )
        .unwrap();
    assert_eq!(done["state"], "done");
    let (code, _) = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": bob, "request_id": "alice-1"}),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
    let (code, _) = gw
        .client()
        .json(
            "/v1/cancel",
            json!({"user_id": bob, "request_id": "alice-1"}),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
    // Only Alice's request reached the laptop.
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(fake.requests()[0].0, "alice-1");
}

#[test]
fn anything_but_a_devices_connect_token_is_refused_before_the_upgrade() {
    let (stack, port) = Stack::start_with_gateway();
    let _gw = Gatewayd::start(&stack, port);
    let (write_token, _, _) = device_token(&stack, "carol", &["workflows:write"]);
    let refused = super::harness::block_on(dial(port, Some(&write_token)))
        .err()
        .unwrap();
    assert_eq!(refused.0, 403, "{refused:?}");
    assert!(refused.1.contains("insufficient_scope"), "{refused:?}");

    let refused = super::harness::block_on(dial(port, Some("aw_not.a-real-token")))
        .err()
        .unwrap();
    assert_eq!(refused.0, 401, "{refused:?}");
    let refused = super::harness::block_on(dial(port, None)).err().unwrap();
    assert_eq!(refused.0, 401, "{refused:?}");
    assert!(refused.1.contains("missing_token"), "{refused:?}");

    let (status, _, body) = http(port, "GET", "/v1/other", &[], "");
    assert_eq!(status, 404, "{body}");
    // The right path without a WebSocket upgrade (but with a token) is refused too.
    let (status, _, body) = http(
        port,
        "GET",
        "/v1/executor",
        &[("authorization", &format!("Bearer {write_token}"))],
        "",
    );
    assert_eq!(status, 400, "{body}");
}

#[test]
fn a_dispatch_is_sent_once_and_replayed_from_its_record() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    let body = dispatch_body(
        &alice,
        &fake.device_id,
        "proj",
        "req-42",
        shell("echo hi", Some(5)),
    );

    let first = gw.client().json("/v1/dispatch", body.clone()).unwrap();
    assert_eq!(first["state"], "done", "{first}");
    assert_eq!(first["outcome"]["status"], "completed");
    assert_eq!(first["outcome"]["stdout"], "echo hi");
    assert_eq!(first["outcome"]["exit_code"], 0);
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].0, "req-42",
        "the laptop gets the server's request id"
    );
    assert_eq!(requests[0].1, "proj");

    // Same id again: the recorded outcome, nothing sent.
    let again = gw.client().json("/v1/dispatch", body).unwrap();
    assert_eq!(again, first);
    let outcome = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-42"}),
        )
        .unwrap();
    assert_eq!(outcome, first);
    let cancel = gw
        .client()
        .json(
            "/v1/cancel",
            json!({"user_id": alice, "request_id": "req-42"}),
        )
        .unwrap();
    assert_eq!(cancel["cancel_sent"], false);
    assert_eq!(cancel["state"], "done");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        fake.requests().len(),
        1,
        "a replayed request id was re-sent"
    );

    // A folder the device does not share.
    let (code, _) = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &fake.device_id,
                "secret",
                "req-43",
                shell("id", None),
            ),
        )
        .unwrap_err();
    assert_eq!(code, "folder_not_granted");
    assert_eq!(fake.requests().len(), 1);
}

#[test]
fn a_disconnect_fails_the_pending_dispatch_at_once_and_it_is_never_resent() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Hang).unwrap();
    let client = gw.client();
    let body = dispatch_body(
        &alice,
        &fake.device_id,
        "proj",
        "req-hang",
        shell("sleep 100", Some(60)),
    );
    let waiting = std::thread::spawn(move || {
        let answer = client.json("/v1/dispatch", body).unwrap();
        (answer, Instant::now())
    });
    fake.wait_requests(1);
    let dropped = Instant::now();
    fake.vanish();
    let (answer, answered) = waiting.join().unwrap();
    assert_eq!(answer["state"], "unknown", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("disconnected"),
        "{answer}"
    );
    // The deadline was 90 s; the answer came with the disconnect.
    assert!(
        answered - dropped < Duration::from_secs(5),
        "{:?}",
        answered - dropped
    );
    let outcome = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-hang"}),
        )
        .unwrap();
    assert_eq!(outcome["state"], "unknown");

    // The device comes back under the same id; the request id is never sent again.
    let back = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    assert_eq!(back.device_id, fake.device_id);
    let replay = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &back.device_id,
                "proj",
                "req-hang",
                shell("sleep 100", Some(60)),
            ),
        )
        .unwrap();
    assert_eq!(replay["state"], "unknown");
    std::thread::sleep(Duration::from_millis(200));
    assert!(back.requests().is_empty(), "{:?}", back.requests());
}

#[test]
fn revoking_the_token_closes_the_connection_within_a_second() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, token_id, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Hang).unwrap();
    let client = gw.client();
    let body = dispatch_body(
        &alice,
        &fake.device_id,
        "proj",
        "req-rev",
        shell("sleep 100", None),
    );
    let waiting = std::thread::spawn(move || client.json("/v1/dispatch", body).unwrap());
    fake.wait_requests(1);

    let out = stack.ctl(&["token", "revoke", &token_id]);
    // The second counts from the revocation's answer, not from starting agentworksctl (a
    // process start alone can take longer than that on a loaded machine).
    let revoked = Instant::now();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, closed) = fake.wait_closed(Duration::from_secs(5));
    let took = closed - revoked;
    assert_eq!(code, Some(4001), "close code");
    assert!(took < Duration::from_secs(1), "revocation took {took:?}");

    let answer = waiting.join().unwrap();
    assert_eq!(answer["state"], "unknown", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("revoked"),
        "{answer}"
    );
    // The revoked token cannot come back.
    let refused = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo)
        .err()
        .unwrap();
    assert_eq!(refused.0, 401, "{refused:?}");
}

#[test]
fn an_offline_device_is_409_device_offline_and_still_listed() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    fake.vanish();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let listed = gw
            .client()
            .json("/v1/devices", json!({"user_id": alice}))
            .unwrap();
        if listed[0]["online"] == false {
            assert_eq!(listed[0]["device_id"], fake.device_id.as_str());
            assert_eq!(listed[0]["folders"][0]["alias"], "proj");
            break;
        }
        assert!(Instant::now() < deadline, "still online: {listed}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, details) = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &fake.device_id,
                "proj",
                "req-off",
                shell("id", None),
            ),
        )
        .unwrap_err();
    assert_eq!(code, "device_offline");
    assert!(
        details["message"].as_str().unwrap().contains("laptop"),
        "{details}"
    );
    // A refused dispatch is not recorded.
    let (code, _) = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-off"}),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
}

#[test]
fn a_peer_not_allowed_on_gatewayd_sock_is_refused() {
    // Only around the user's creation: a stack in cluster mode takes the lock to make its
    // PostgreSQL's user.
    let (uid, gid) = {
        let _users = users_lock();
        ensure_user("awtest-notagentd", &[])
    };
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    std::fs::set_permissions(
        gw.socket.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        &gw.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    for (path, body) in [
        ("/v1/devices", "{\"user_id\":\"u\"}"),
        ("/v1/dispatch", "{}"),
    ] {
        let out = std::process::Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
            ])
            .args(["curl", "-s", "--unix-socket"])
            .arg(&gw.socket)
            .arg(format!("http://_{path}"))
            .args(["-H", "content-type: application/json", "-d", body])
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout);
        assert!(answer.contains("peer_forbidden"), "{path}: {answer}");
    }
    // The owner's own uid (root here) is served.
    let health: agentworks_contract::gatewayd::GatewayHealth =
        super::harness::block_on(gw.client().inner.get("/v1/health")).unwrap();
    assert_eq!(health.health.status, "ok");
    assert_eq!(health.health.daemon, "agentworks-gatewayd");
    assert_eq!(health.connected, 0);
}

#[test]
fn a_malformed_or_unknown_frame_closes_the_connection_with_1008() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    for (name, frame) in [
        ("a", "{not json"),
        ("b", r#"{"type":"format_disk"}"#),
        (
            "c",
            r#"{"type":"result","request_id":"x","outcome":{"status":"completed","stdout":"","stderr":"","exit_code":0,"root":"/"}}"#,
        ),
        (
            "d",
            r#"{"type":"hello","device_name":"d","version":"1","folders":[]}"#,
        ),
    ] {
        let fake = FakeExecutor::connect(port, &token, name, &[("proj", RW)], Reply::Echo).unwrap();
        fake.raw(frame);
        let (code, _) = fake.wait_closed(Duration::from_secs(5));
        assert_eq!(code, Some(1008), "{frame}");
    }
    // A hello that breaks the rules is refused before registering.
    let refused = FakeExecutor::connect(port, &token, "../etc", &[("../up", RW)], Reply::Echo)
        .err()
        .unwrap();
    assert_eq!(refused.0, 1008, "{refused:?}");
    // A result for a request this connection never got is ignored, and the connection lives.
    let fake = FakeExecutor::connect(port, &token, "e", &[("proj", RW)], Reply::Echo).unwrap();
    fake.raw(r#"{"type":"result","request_id":"someone-elses","outcome":{"status":"refused","code":"x","message":"y"}}"#);
    let done = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(&alice, &fake.device_id, "proj", "req-e", shell("id", None)),
        )
        .unwrap();
    assert_eq!(done["state"], "done");
    let (code, _) = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "someone-elses"}),
        )
        .unwrap_err();
    assert_eq!(code, "not_found");
}

#[test]
fn a_second_connection_of_the_same_device_replaces_the_first() {
    let (stack, port) = Stack::start_with_gateway();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let first =
        FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Hang).unwrap();
    let client = gw.client();
    let body = dispatch_body(
        &alice,
        &first.device_id,
        "proj",
        "req-old",
        shell("sleep 100", None),
    );
    let waiting = std::thread::spawn(move || client.json("/v1/dispatch", body).unwrap());
    first.wait_requests(1);
    let second =
        FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    assert_eq!(second.device_id, first.device_id);
    let (code, _) = first.wait_closed(Duration::from_secs(5));
    assert_eq!(code, Some(4002));
    assert_eq!(waiting.join().unwrap()["state"], "unknown");
    let done = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &second.device_id,
                "proj",
                "req-new",
                shell("id", None),
            ),
        )
        .unwrap();
    assert_eq!(done["state"], "done");
    assert_eq!(second.requests().len(), 1);
    let listed = gw
        .client()
        .json("/v1/devices", json!({"user_id": alice}))
        .unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn outcomes_survive_a_gatewayd_restart() {
    let (stack, port) = Stack::start_with_gateway();
    let mut gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    let done = gw
        .client()
        .json(
            "/v1/dispatch",
            dispatch_body(
                &alice,
                &fake.device_id,
                "proj",
                "req-kept",
                shell("echo kept", None),
            ),
        )
        .unwrap();
    assert_eq!(done["state"], "done");

    // A clean stop says "going away" to the executor.
    let port = gw.port;
    assert!(gw.stop().success());
    let (code, _) = fake.wait_closed(Duration::from_secs(5));
    assert_eq!(code, Some(1001));

    let mut gw = Gatewayd::start(&stack, port);
    let outcome = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-kept"}),
        )
        .unwrap();
    assert_eq!(outcome, done);

    // A request pending when gatewayd dies is unknown after the restart, not pending.
    let hanging =
        FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Hang).unwrap();
    assert_eq!(
        hanging.device_id, fake.device_id,
        "device ids are stable across restarts"
    );
    let client = gw.client();
    let body = dispatch_body(
        &alice,
        &hanging.device_id,
        "proj",
        "req-lost",
        shell("sleep 100", None),
    );
    // Its answer is lost with the process; only the record counts.
    let waiting =
        std::thread::spawn(move || client.post::<_, Value>("/v1/dispatch", &body).is_ok());
    hanging.wait_requests(1);
    gw.child.kill().unwrap();
    gw.child.wait().unwrap();
    assert!(!waiting.join().unwrap(), "a killed gatewayd answered");
    let gw = Gatewayd::start(&stack, port);
    let outcome = gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice, "request_id": "req-lost"}),
        )
        .unwrap();
    assert_eq!(outcome["state"], "unknown", "{outcome}");
}

#[test]
fn a_silent_executor_is_dropped_after_three_heartbeats() {
    let (stack, port) = Stack::start_with_gateway();
    // The [gatewayd] section is last in the file: this key lands in it.
    let config = stack.state.root().join("agentworks.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}heartbeat_secs = 1\n")).unwrap();
    let gw = Gatewayd::start(&stack, port);
    let (token, _, alice) = device_token(&stack, "alice", &["devices:connect"]);
    let fake = FakeExecutor::connect(port, &token, "laptop", &[("proj", RW)], Reply::Echo).unwrap();
    // Answering pings keeps it online past three intervals.
    std::thread::sleep(Duration::from_millis(3500));
    let listed = gw
        .client()
        .json("/v1/devices", json!({"user_id": alice}))
        .unwrap();
    assert_eq!(listed[0]["online"], true, "{listed}");
    fake.freeze();
    let frozen = Instant::now();
    loop {
        let listed = gw
            .client()
            .json("/v1/devices", json!({"user_id": alice}))
            .unwrap();
        if listed[0]["online"] == false {
            break;
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(8),
            "a silent executor stayed online"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        frozen.elapsed() >= Duration::from_secs(2),
        "dropped before three heartbeats"
    );
}
