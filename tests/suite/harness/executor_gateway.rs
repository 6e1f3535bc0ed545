//! An in-test WebSocket gateway for the laptop executor (`agentworks executor connect`): it
//! accepts the executor's connection as gatewayd would (checking the path, answering the Hello
//! with a Welcome), sends requests and reads their results with `gateway::protocol`'s frames.
//! Also starting the executor against it. Used by the executor suite and the power-loss suite;
//! it runs nothing but the `agentworks` binary and binds only a loopback port.

use super::Laptop;
use agentworks_contract::executor::{ExecutorFrame, GatewayFrame, Operation, Outcome};
use futures_util::{SinkExt, StreamExt};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

pub type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

pub struct Gateway {
    listener: tokio::net::TcpListener,
}

impl Gateway {
    pub async fn new() -> Gateway {
        Gateway {
            listener: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }
    pub fn url(&self) -> String {
        format!(
            "ws://127.0.0.1:{}",
            self.listener.local_addr().unwrap().port()
        )
    }
    /// Accept the executor: returns the socket, the bearer it sent and its Hello.
    #[allow(clippy::result_large_err)] // the handshake callback's error type is tungstenite's
    pub async fn accept(&self) -> (Ws, String, ExecutorFrame) {
        let (tcp, _) = tokio::time::timeout(Duration::from_secs(20), self.listener.accept())
            .await
            .expect("the executor did not connect")
            .unwrap();
        let mut auth = String::new();
        let mut path = String::new();
        let mut ws = tokio_tungstenite::accept_hdr_async(
            tcp,
            |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                auth = req
                    .headers()
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                path = req.uri().path().to_owned();
                Ok(resp)
            },
        )
        .await
        .unwrap();
        assert_eq!(path, "/v1/executor");
        let hello = next_frame(&mut ws).await;
        send(
            &mut ws,
            &GatewayFrame::Welcome {
                device_id: "dev-1".into(),
                heartbeat_secs: 30,
                notice: None,
                gateways: Vec::new(),
                account: None,
            },
        )
        .await;
        (ws, auth, hello)
    }
}

pub async fn send(ws: &mut Ws, frame: &GatewayFrame) {
    ws.send(Message::text(serde_json::to_string(frame).unwrap()))
        .await
        .unwrap();
}

pub async fn next_frame(ws: &mut Ws) -> ExecutorFrame {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("no frame from the executor")
            .expect("closed")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

pub async fn request(ws: &mut Ws, id: &str, folder: &str, operation: Operation) -> Outcome {
    send(
        ws,
        &GatewayFrame::Request {
            request_id: id.into(),
            folder: folder.into(),
            operation,
        },
    )
    .await;
    loop {
        match next_frame(ws).await {
            ExecutorFrame::Result {
                request_id,
                outcome,
            } if request_id == id => return outcome,
            _ => {}
        }
    }
}

pub fn shell(command: &str) -> Operation {
    Operation::ExecuteShellCommand {
        command: command.into(),
        timeout: None,
    }
}

pub fn patch(filepath: &str, diff: &str) -> Operation {
    Operation::DiffPatchWorkspaceFile {
        filepath: filepath.into(),
        diff: diff.into(),
    }
}

/// `agentworks executor connect`, killed and reaped when dropped, also when a test fails: an
/// executor left running reconnects for ever, holding the test run's stderr (and a mount) open.
pub fn spawn_executor(laptop: &Laptop, gateway: &str, args: &[&str]) -> super::KillOnDrop {
    let mut all = vec![
        "executor",
        "connect",
        "--name",
        "test-laptop",
        "--gateway",
        gateway,
    ];
    all.extend(args);
    super::KillOnDrop(
        laptop
            .command(&all)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

pub fn wait_exit(child: &mut Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "the executor did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
