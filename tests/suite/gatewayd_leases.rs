//! Device leases across two gatewayd hosts (issue 16), end to end: one real PostgreSQL and
//! nats-server from the harness, two gatewayd processes sharing the database (hosts `gw-a` and
//! `gw-b`, heartbeat 1 s, so a lease lasts 3 s unless renewed), one agentd, and a minimal
//! executor that accepts every request and answers none (so a request stays pending).
//!
//! A connected device's lease is this host's and visible from the other host, which refuses a
//! dispatch to it naming the holder; a disconnect releases it; a host killed with SIGKILL loses
//! its leases within the expiry window and its pending request reads `unknown` from the other
//! host; the device reconnecting to the other host keeps its id.

use super::harness::start_gatewayd_host;
use super::harness::{Gatewayd, Nats, Postgres, Stack, block_on, free_port, wait_until};
use agentworks_contract::executor::{ExecutorFrame, FolderAccess, FolderInfo, GatewayFrame};
use agentworks_support::unix_http::UnixClient;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// An executor that accepts requests and never answers them; dropping `stop` closes it.
struct Silent {
    device_id: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Silent {
    /// Closes the connection (a normal close) and waits until the socket is closed.
    fn disconnect(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        let _ = self.done.recv_timeout(Duration::from_secs(10));
    }
}

fn silent_executor(port: u16, token: &str) -> Silent {
    let (welcomed, welcome) = std::sync::mpsc::channel();
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let (finished, done) = std::sync::mpsc::channel();
    let token = token.to_owned();
    std::thread::spawn(move || {
        block_on(async move {
            let mut request = format!("ws://127.0.0.1:{port}/v1/executor")
                .into_client_request()
                .unwrap();
            let bearer = format!("Bearer {token}").parse().unwrap();
            request.headers_mut().insert("authorization", bearer);
            let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
            let send = |frame: &ExecutorFrame| Message::text(serde_json::to_string(frame).unwrap());
            let hello = ExecutorFrame::Hello {
                device_name: "laptop".into(),
                version: "test".into(),
                folders: vec![FolderInfo {
                    alias: "proj".into(),
                    access: FolderAccess::ReadWrite,
                    downloads: false,
                }],
            };
            ws.send(send(&hello)).await.unwrap();
            loop {
                let message = tokio::select! {
                    _ = &mut stopped => {
                        let _ = ws.close(None).await;
                        while let Some(Ok(_)) = ws.next().await {}
                        break;
                    }
                    message = ws.next() => message,
                };
                let Some(Ok(Message::Text(text))) = message else {
                    if matches!(message, None | Some(Err(_))) {
                        break;
                    }
                    continue;
                };
                match serde_json::from_str::<GatewayFrame>(text.as_str()).unwrap() {
                    GatewayFrame::Welcome { device_id, .. } => {
                        welcomed.send(device_id).unwrap();
                    }
                    GatewayFrame::Request { request_id, .. } => {
                        let accepted = ExecutorFrame::Accepted { request_id };
                        let _ = ws.send(send(&accepted)).await;
                    }
                    _ => {}
                }
            }
            let _ = finished.send(());
        })
    });
    let device_id = welcome
        .recv_timeout(Duration::from_secs(20))
        .expect("no welcome from gatewayd");
    Silent {
        device_id,
        stop: Some(stop),
        done,
    }
}

/// The host holding `device_id`'s lease row, or "" when there is none.
fn lease_holder(postgres: &Postgres, device_id: &str) -> String {
    postgres.psql(
        "agentworks",
        &format!("SELECT host_id FROM gateway_leases WHERE device_id = '{device_id}'"),
    )
}

#[test]
fn leases_follow_the_device_and_a_killed_host_loses_them_and_its_pending_requests() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let (stack, port_a) = Stack::start_with_gateway();
    let path = stack.state.root().join("agentworks.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    // The heartbeat (and so the lease renewal) every second: a lease lasts 3 s.
    std::fs::write(
        &path,
        format!(
            "{config}heartbeat_secs = 1\n[cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\n\
             host_id = \"gw-a\"\n",
            postgres.url(),
            nats.url()
        ),
    )
    .unwrap();
    let gw_a = Gatewayd::start(&stack, port_a);
    let port_b = free_port();
    let mut gw_b = start_gatewayd_host(
        &stack,
        port_a,
        port_b,
        "gatewayd-b",
        &[("host_id = \"gw-a\"", "host_id = \"gw-b\"")],
    );
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let created = stack.admin(
        "tokens/create",
        json!({"user": "alice", "scopes": ["devices:connect"]}),
    );
    let token = created["token"].as_str().unwrap();
    let alice = created["info"]["user_id"].as_str().unwrap();

    // Connected to A: A's lease; a disconnect releases it.
    let on_a = silent_executor(port_a, token);
    let device_id = on_a.device_id.clone();
    assert_eq!(lease_holder(&postgres, &device_id), "gw-a");
    on_a.disconnect();
    wait_until(
        "the lease is released at the disconnect",
        Duration::from_secs(5),
        || lease_holder(&postgres, &device_id).is_empty(),
    );

    // Connected to B: B's lease, visible from A, which refuses a dispatch naming B.
    let on_b = silent_executor(port_b, token);
    assert_eq!(on_b.device_id, device_id, "one device, whichever host");
    assert_eq!(lease_holder(&postgres, &device_id), "gw-b");
    let dispatch = |request_id: &str| {
        json!({"user_id": alice, "device_id": device_id, "folder": "proj",
               "request_id": request_id, "operation":
               {"kind": "execute_shell_command", "command": "sleep 300", "timeout": 300}})
    };
    let (code, error) = gw_a
        .client()
        .json("/v1/dispatch", dispatch("req-via-a"))
        .unwrap_err();
    assert_eq!(code, "device_on_other_host", "{error}");
    assert_eq!(error["host_id"], "gw-b", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("\"gw-b\""),
        "{error}"
    );
    // Still held by B after several renewals (3 s is one lease without them).
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(lease_holder(&postgres, &device_id), "gw-b");

    // A request pending on B (the executor accepted it and never answers).
    let body = dispatch("req-lost");
    let socket_b = gw_b.socket.clone();
    std::thread::spawn(move || {
        // Ends with a transport error when B is killed; nothing waits for it.
        let client = UnixClient::new(&socket_b);
        let _ = block_on(client.post::<_, serde_json::Value>("/v1/dispatch", &body));
    });
    let state_of = |request_id: &str| {
        postgres.psql(
            "agentworks",
            &format!(
                "SELECT host_id || ' ' || state FROM gateway_requests \
                 WHERE request_id = '{request_id}'"
            ),
        )
    };
    wait_until(
        "the request is pending on B",
        Duration::from_secs(10),
        || state_of("req-lost") == "gw-b pending",
    );

    // B dies without a word: within the expiry window (three missed renewals, plus A's pass)
    // its lease is gone and A reads the request as unknown.
    gw_b.child.kill().unwrap();
    let killed = Instant::now();
    let _ = gw_b.child.wait();
    wait_until(
        "B's lease expires and its request becomes unknown",
        Duration::from_secs(10),
        || lease_holder(&postgres, &device_id).is_empty() && state_of("req-lost") == "gw-b unknown",
    );
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let outcome = gw_a
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
    drop(on_b);

    // The device reconnects to A: the same id, A's lease.
    let back = silent_executor(port_a, token);
    assert_eq!(back.device_id, device_id);
    assert_eq!(lease_holder(&postgres, &device_id), "gw-a");
}
