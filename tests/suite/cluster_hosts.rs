//! Two hosts of each (issue 16): agentd A with gatewayd A, agentd B with gatewayd B, one
//! workspaced, one PostgreSQL and one nats-server, and the real laptop executor on gateway B.
//! A chat made and run on agentd A runs its command on the laptop through gateway B (agentd A
//! finds the lease holder with any gatewayd and calls it over NATS), and the same chat,
//! with its turn and the command's result, is read back through agentd B: chats, bindings and
//! tokens live in the shared database, not in either host. Then gateway B is killed with a
//! command of the chat running on the laptop: gateway A makes that request `unknown` (never
//! re-sent), the executor fails over to gateway A, agentd recovers the call from the laptop's
//! receipt (it was cut off), and the chat's next command runs there on the same binding. While that turn runs on agentd A, agentd B refuses another turn in the chat.

use super::agent::LaptopExt;
use super::agent::{
    Model, api, calls, code_project, create_chat, of_kind, result_of, text, turn, user,
};
use super::harness::{Gatewayd, Laptop, Stack, free_port, http, start_gatewayd_host, wait_until};
use agentworks_contract::cluster::{AGENTD_CANCEL_TURN, PEER_MAC_HEADER, PeerCall, agentd_subject};
use agentworks_daemon::bus::BusKey;
use serde_json::{Value, json};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn a_chat_on_agentd_a_runs_on_a_laptop_connected_to_gateway_b_and_reads_back_through_agentd_b() {
    let model = Model::start();
    let (stack, port_gw_a) = Stack::start_in_cluster_with_gateway_and(&model.config());
    // Leases last three heartbeats: a killed host's are settled within about 3 s.
    let config_path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, format!("{config}heartbeat_secs = 1\n")).unwrap();
    let gw_a = Gatewayd::start(&stack, port_gw_a);
    let root = stack.state.root().to_owned();
    let (port_b, port_gw_b) = (free_port(), free_port());
    let (agentd_b_socket, gatewayd_b_socket) = (
        root.join("run/agentd-b.sock"),
        root.join("run/gatewayd-b.sock"),
    );
    // Host B's config: its own agentd port and socket, and its gatewayd (started by the harness
    // from this file with its own port and socket) talks to agentd B.
    let agentd_listen = format!("listen = \"127.0.0.1:{}\"", stack.port);
    let host_b = |config: &str| {
        config
            .replace(
                &agentd_listen,
                &format!("listen = \"127.0.0.1:{port_b}\"\nsocket = {agentd_b_socket:?}"),
            )
            .replace("host_id = \"gw-test\"", "host_id = \"host-b\"")
    };
    let mut gw_b = start_gatewayd_host(
        &stack,
        port_gw_a,
        port_gw_b,
        "gatewayd-b",
        &[
            (
                agentd_listen.as_str(),
                &format!("{agentd_listen}\nsocket = {agentd_b_socket:?}"),
            ),
            ("host_id = \"gw-test\"", "host_id = \"host-b\""),
        ],
    );
    let config = std::fs::read_to_string(root.join("agentworks.toml")).unwrap();
    let gatewayd_listen = format!("listen = \"127.0.0.1:{port_gw_a}\"");
    let config_b = host_b(&config).replace(
        &gatewayd_listen,
        &format!("listen = \"127.0.0.1:{port_gw_b}\"\nsocket = {gatewayd_b_socket:?}"),
    );
    let path_b = root.join("host-b.toml");
    std::fs::write(&path_b, config_b).unwrap();
    let _agentd_b = stack.spawn_agentd(&path_b, Stdio::inherit());
    wait_until("agentd B answers", Duration::from_secs(20), || {
        std::net::TcpStream::connect(("127.0.0.1", port_b)).is_ok()
            && http(port_b, "GET", "/v1/health", &[], "").0 == 200
    });

    // Everything made through agentd A.
    let alice = user(&stack, "alice");
    a_device_login_moves_between_hosts(&stack, port_b);
    code_project(&stack, "app", "alice", &[]);
    let connect = stack.token("alice", &["devices:connect"], json!({}));
    let laptop = Laptop::new("aw-two-hosts-", &[("src/repo/a.txt", "from the laptop\n")]);
    let ws = |port: u16| format!("ws://127.0.0.1:{port}");
    laptop.login_to(&stack, &[&ws(port_gw_b), &ws(port_gw_a)], &connect);
    let _executor = laptop.connect();
    wait_until(
        "the executor is on gateway B",
        Duration::from_secs(20),
        || gw_b.connected() == 1,
    );
    assert_eq!(gw_a.connected(), 0);
    // agentd A lists the device online: its lease is gateway B's.
    let mut device_id = String::new();
    wait_until(
        "agentd A lists the device online",
        Duration::from_secs(20),
        || {
            let (status, body) = api(&stack, &alice, "GET", "/v1/devices", Value::Null);
            assert_eq!(status, 200, "{body}");
            let online = body["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["online"] == true)
                .cloned();
            if let Some(device) = online {
                device_id = device["device_id"].as_str().unwrap().to_owned();
            }
            !device_id.is_empty()
        },
    );

    let chat = create_chat(&stack, &alice, "app");
    let (status, bound) = api(
        &stack,
        &alice,
        "PUT",
        &format!("/v1/chats/{chat}/binding"),
        json!({"device_id": device_id, "folder": "repo", "confirm": super::agent::CONFIRM}),
    );
    assert_eq!(status, 200, "{bound}");
    model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": "cat a.txt; hostname > /dev/null"}),
        )]),
        text("Read it."),
    ]);
    let events = turn(stack.port, &alice, &chat, "read a.txt").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:?}"
    );
    let c1 = result_of(&events, "c1");
    assert_eq!(c1["ok"], true, "{c1}");
    assert_eq!(c1["result"]["stdout"], "from the laptop\n", "{c1}");

    // The chat, its binding and the turn, read through agentd B.
    let auth = format!("Bearer {alice}");
    let (status, _, body) = http(
        port_b,
        "GET",
        &format!("/v1/chats/{chat}"),
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200, "{body}");
    let stored: Value = serde_json::from_str(&body).unwrap();
    let roles: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "assistant"],
        "{stored}"
    );
    assert!(stored.to_string().contains("from the laptop"), "{stored}");
    assert_eq!(
        stored["binding"]["device_id"],
        device_id.as_str(),
        "{stored}"
    );
    // Both agentd share a state root here, so show where the chat is: in PostgreSQL, and in
    // no SQLite file either host could have read.
    let (postgres, _) = stack.cluster.as_ref().unwrap();
    let messages = postgres.psql(
        "agentworks",
        &format!("SELECT count(*) FROM agentd.messages WHERE chat_id = '{chat}'"),
    );
    assert_eq!(messages, "4");
    assert!(!root.join("agent/chats.db").exists());

    // Gateway B dies under a running command of the chat.
    model.play(vec![
        calls(&[(
            "c2",
            "execute_shell_command",
            json!({"command": "sleep 30"}),
        )]),
        text("It was cut off."),
    ]);
    let running = {
        let (alice, chat, port) = (alice.clone(), chat.clone(), stack.port);
        std::thread::spawn(move || turn(port, &alice, &chat, "wait a while"))
    };
    wait_until(
        "the command is pending on gateway B",
        Duration::from_secs(20),
        || {
            postgres.psql(
            "agentworks",
            "SELECT count(*) FROM gateway_requests WHERE state = 'pending' AND host_id = 'host-b'",
        ) == "1"
        },
    );
    // One turn at a time in a chat, across hosts too: agentd B refuses a second one, naming A.
    let (status, _, refused) = http(
        port_b,
        "POST",
        &format!("/v1/chats/{chat}/turns"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &json!({"message": "me too"}).to_string(),
    );
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused.contains("turn_running") && refused.contains("gw-test"),
        "{refused}"
    );
    gw_b.child.kill().unwrap();
    let _ = gw_b.child.wait();
    // gateway A makes B's pending request unknown (never re-sent); agentd, left without an
    // answer, recovers it as on one host: the laptop, back on gateway A, tells from its receipt
    // that the command was cut off (its connection ended), not that it finished.
    let events = running.join().unwrap().unwrap();
    let c2 = result_of(&events, "c2");
    assert_eq!(c2["result"]["cancelled"], true, "{c2}");
    assert_eq!(c2["summary"], "cancelled", "{c2}");
    let recorded = postgres.psql(
        "agentworks",
        "SELECT state FROM gateway_requests WHERE request_id LIKE '%-turn-2-call-1'",
    );
    assert_eq!(recorded, "done", "the laptop's receipt is recorded");
    wait_until(
        "the executor failed over to gateway A",
        Duration::from_secs(20),
        || gw_a.connected() == 1,
    );

    // The same binding, the same device, now through gateway A.
    model.play(vec![
        calls(&[(
            "c3",
            "execute_shell_command",
            json!({"command": "cat a.txt"}),
        )]),
        text("Read it again."),
    ]);
    let events = turn(stack.port, &alice, &chat, "read a.txt again").unwrap();
    let c3 = result_of(&events, "c3");
    assert_eq!(c3["ok"], true, "{c3}");
    assert_eq!(c3["result"]["stdout"], "from the laptop\n", "{c3}");
    // The command cut off was never sent again.
    let sent = postgres.psql(
        "agentworks",
        "SELECT count(*) FROM gateway_requests WHERE request_id LIKE '%-call-%'",
    );
    assert_eq!(sent, "3", "three commands recorded, each once");

    // A turn running on A is stopped through agentd B: B finds A's claim on the chat and asks
    // A over NATS; the command on the laptop is cancelled and the turn ends `cancelled`.
    let sleeper = "sleep 47.5";
    model.play(vec![calls(&[(
        "c4",
        "execute_shell_command",
        json!({"command": sleeper, "timeout": 120}),
    )])]);
    let running = {
        let (alice, chat, port) = (alice.clone(), chat.clone(), stack.port);
        std::thread::spawn(move || turn(port, &alice, &chat, "wait again"))
    };
    wait_until(
        "the command is pending on gateway A (host gw-test)",
        Duration::from_secs(20),
        || {
            postgres.psql(
            "agentworks",
            "SELECT count(*) FROM gateway_requests WHERE state = 'pending' AND host_id = 'gw-test'",
        ) == "1"
        },
    );
    // The binding does not change under a turn running on another host.
    let (status, _, refused) = http(
        port_b,
        "DELETE",
        &format!("/v1/chats/{chat}/binding"),
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused.contains("turn_running") && refused.contains("gw-test"),
        "{refused}"
    );
    // The attack first: cancels published straight on A's subject by someone without the
    // cluster's agentd key (none, or another key) stop nothing.
    let (_, nats) = stack.cluster.as_ref().unwrap();
    let subject = agentd_subject("gw-test");
    let forged = serde_json::to_vec(&PeerCall {
        origin: "attacker".into(),
        sent_at_ms: agentworks_support::clock::now_ms(),
        path: AGENTD_CANCEL_TURN.into(),
        body: json!({"chat_id": chat}).to_string(),
    })
    .unwrap();
    nats.publish_with_headers(&subject, &[], &forged);
    let wrong_mac = BusKey::new([9; 32]).seal(&subject, &forged);
    nats.publish_with_headers(&subject, &[(PEER_MAC_HEADER, &wrong_mac)], &forged);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        postgres.psql(
            "agentworks",
            "SELECT count(*) FROM gateway_requests WHERE state = 'pending' AND host_id = 'gw-test'",
        ),
        "1",
        "a cancel without the cluster's key stopped the command"
    );
    let (status, _, cancelled) = http(
        port_b,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 202, "{cancelled}");
    let cancelled: Value = serde_json::from_str(&cancelled).unwrap();
    assert_eq!(cancelled["chat_id"], chat.as_str(), "{cancelled}");
    assert_eq!(cancelled["turn"], 4, "{cancelled}");
    let events = running.join().unwrap().unwrap();
    assert_eq!(
        events.last().unwrap().1["reason"],
        "cancelled",
        "{events:?}"
    );
    let c4 = result_of(&events, "c4");
    assert_eq!(c4["result"]["cancelled"], true, "{c4}");
    // Nothing runs now: B says so itself, as A would.
    let (status, _, none) = http(
        port_b,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 409, "{none}");
    assert!(none.contains("no_turn_running"), "{none}");
    // And with no turn running, B changes the binding.
    let (status, _, unbound) = http(
        port_b,
        "DELETE",
        &format!("/v1/chats/{chat}/binding"),
        &[("authorization", &auth)],
        "",
    );
    assert_eq!(status, 200, "{unbound}");
    assert!(unbound.contains("\"binding\":null"), "{unbound}");
}

/// `agentworks login` with each step on another agentd host, as behind a load balancer: the
/// code comes from B, B and A both answer the polls, A's operator approves it, A mints the
/// token, and B then refuses the code as used. Held in one host's memory, A's approval found
/// no such login.
fn a_device_login_moves_between_hosts(stack: &Stack, port_b: u16) {
    use super::device_login::form_value;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let (status, _, text) = http(
        port_b,
        "POST",
        "/v1/device/code",
        &form,
        "device_name=roaming",
    );
    assert_eq!(status, 200, "{text}");
    let code: Value = serde_json::from_str(&text).unwrap();
    let poll = |port: u16| {
        let body = format!(
            "grant_type={}&device_code={}",
            form_value("urn:ietf:params:oauth:grant-type:device_code"),
            code["device_code"].as_str().unwrap()
        );
        let (status, _, text) = http(port, "POST", "/v1/device/token", &form, &body);
        (status, serde_json::from_str::<Value>(&text).unwrap())
    };
    let (status, pending) = poll(stack.port);
    assert_eq!(status, 400);
    assert_eq!(pending["error"], "authorization_pending", "{pending}");
    let approved = stack.admin(
        "login/approve",
        json!({"user_code": code["user_code"], "user": "alice"}),
    );
    assert_eq!(approved["approved"], true, "{approved}");
    std::thread::sleep(Duration::from_millis(DEVICE_POLL_GAP_MS));
    let (status, granted) = poll(stack.port);
    assert_eq!(status, 200, "{granted}");
    let (status, used) = poll(port_b);
    assert_eq!(status, 400);
    assert_eq!(used["error"], "invalid_grant", "{used}");
    let tokens = super::device_login::login_tokens(stack);
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert_eq!(tokens[0]["label"], "agentworks login: roaming");
}

/// Longer than half the polling interval, so a poll is not answered `slow_down`.
const DEVICE_POLL_GAP_MS: u64 = 1_100;
