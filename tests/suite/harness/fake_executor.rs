//! A scripted executor (tokio-tungstenite on its own thread) for the gatewayd tests: it says
//! hello with the folders given, answers requests as its [`Reply`] says, records every frame it
//! gets, and can vanish, freeze or send raw frames on command.

use super::{Stack, block_on};
use agentworks_contract::executor::{
    ExecutorFrame, FolderAccess, FolderInfo, GatewayFrame, Operation, Outcome,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// What the fake executor does with a request.
#[derive(Clone, Copy, PartialEq)]
pub enum Reply {
    /// Accept it, then answer `Completed` with the command as stdout and exit code 0.
    Echo,
    /// Accept it and never answer.
    Hang,
}

enum Command {
    /// Drop the TCP connection without a close frame.
    Vanish,
    /// Send this text frame as is.
    Raw(String),
    /// Stop reading and writing (no pongs) but keep the TCP connection open.
    Freeze,
}

#[derive(Default)]
pub struct Seen {
    /// Every request frame: (request id, folder, operation).
    pub requests: Vec<(String, String, Operation)>,
    pub cancels: Vec<String>,
    /// The close code the gateway sent (None: closed without one) and when it arrived.
    pub closed: Option<(Option<u16>, Instant)>,
}

/// A scripted executor on its own thread and runtime, standing in for
/// `agentworks executor connect` where a test needs to script the wire.
pub struct FakeExecutor {
    pub device_id: String,
    seen: Arc<Mutex<Seen>>,
    control: tokio::sync::mpsc::UnboundedSender<Command>,
}

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Dial `/v1/executor`; a refused upgrade gives (status, body).
pub async fn dial(port: u16, token: Option<&str>) -> Result<Ws, (u16, String)> {
    let mut request = format!("ws://127.0.0.1:{port}/v1/executor")
        .into_client_request()
        .unwrap();
    if let Some(token) = token {
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(other) => panic!("cannot dial the gateway: {other}"),
    }
}

fn text(frame: &ExecutorFrame) -> Message {
    Message::text(serde_json::to_string(frame).unwrap())
}

impl FakeExecutor {
    pub fn connect(
        port: u16,
        token: &str,
        name: &str,
        folders: &[(&str, FolderAccess)],
        reply: Reply,
    ) -> Result<FakeExecutor, (u16, String)> {
        let hello = ExecutorFrame::Hello {
            device_name: name.to_owned(),
            version: "test".to_owned(),
            folders: folders
                .iter()
                .map(|(alias, access)| FolderInfo {
                    alias: (*alias).to_owned(),
                    access: *access,
                    downloads: false,
                })
                .collect(),
        };
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (control, mut commands) = tokio::sync::mpsc::unbounded_channel();
        let (ready, welcomed) = std::sync::mpsc::channel();
        let token = token.to_owned();
        let record = seen.clone();
        std::thread::spawn(move || {
            block_on(async move {
                let mut ws = match dial(port, Some(&token)).await {
                    Ok(ws) => ws,
                    Err(refused) => {
                        let _ = ready.send(Err(refused));
                        return;
                    }
                };
                ws.send(text(&hello)).await.unwrap();
                let device_id = loop {
                    match ws.next().await {
                        Some(Ok(Message::Text(t))) => {
                            match serde_json::from_str::<GatewayFrame>(t.as_str()).unwrap() {
                                GatewayFrame::Welcome { device_id, .. } => break device_id,
                                other => panic!("expected a welcome, got {other:?}"),
                            }
                        }
                        Some(Ok(Message::Close(frame))) => {
                            let code = frame.map(|f| u16::from(f.code)).unwrap_or(0);
                            let _ = ready.send(Err((code, "closed before the welcome".into())));
                            return;
                        }
                        Some(Ok(_)) => continue,
                        other => {
                            let _ = ready.send(Err((0, format!("{other:?}"))));
                            return;
                        }
                    }
                };
                let _ = ready.send(Ok(device_id));
                loop {
                    tokio::select! {
                        command = commands.recv() => match command {
                            Some(Command::Raw(t)) => { let _ = ws.send(Message::text(t)).await; }
                            Some(Command::Freeze) => {
                                    std::future::pending::<()>().await;
                                }
                                Some(Command::Vanish) | None => return,
                        },
                        message = ws.next() => match message {
                            Some(Ok(Message::Text(t))) => {
                                let frame: GatewayFrame = serde_json::from_str(t.as_str()).unwrap();
                                match frame {
                                    GatewayFrame::Request { request_id, folder, operation } => {
                                        record.lock().unwrap().requests.push((request_id.clone(), folder, operation.clone()));
                                        ws.send(text(&ExecutorFrame::Accepted { request_id: request_id.clone() })).await.unwrap();
                                        if reply == Reply::Echo {
                                            let stdout = match operation {
                                                Operation::ExecuteShellCommand { command, .. } => command,
                                                Operation::DiffPatchWorkspaceFile { filepath, .. } => filepath,
                                            };
                                            let outcome = Outcome::Completed {
                                                stdout, stderr: String::new(), exit_code: Some(0),
                                                stdout_truncated: false, stderr_truncated: false,
                                                timed_out: false, cancelled: false, undone: vec![],
                                            };
                                            ws.send(text(&ExecutorFrame::Result { request_id, outcome })).await.unwrap();
                                        }
                                    }
                                    GatewayFrame::Cancel { request_id } => record.lock().unwrap().cancels.push(request_id),
                                    GatewayFrame::ReceiptQuery { .. } => panic!("an unexpected receipt query"),
                                    GatewayFrame::Welcome { .. } => panic!("a second welcome"),
                                }
                            }
                            Some(Ok(Message::Close(frame))) => {
                                let code = frame.map(|f| u16::from(f.code));
                                record.lock().unwrap().closed.get_or_insert((code, Instant::now()));
                            }
                            Some(Ok(_)) => {}
                            None | Some(Err(_)) => {
                                record.lock().unwrap().closed.get_or_insert((None, Instant::now()));
                                return;
                            }
                        },
                    }
                }
            });
        });
        let device_id = welcomed
            .recv_timeout(Duration::from_secs(20))
            .expect("the fake executor neither connected nor failed")?;
        Ok(FakeExecutor {
            device_id,
            seen,
            control,
        })
    }

    pub fn requests(&self) -> Vec<(String, String, Operation)> {
        self.seen.lock().unwrap().requests.clone()
    }

    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        probe: impl Fn(&Seen) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = probe(&self.seen.lock().unwrap()) {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The close code the gateway sent (`None` inside: closed without one) and when, if closed.
    pub fn closed(&self) -> Option<(Option<u16>, Instant)> {
        self.seen.lock().unwrap().closed
    }

    pub fn wait_closed(&self, timeout: Duration) -> (Option<u16>, Instant) {
        self.wait_for(timeout, "the connection to close", |s| s.closed)
    }

    pub fn wait_requests(&self, n: usize) {
        self.wait_for(Duration::from_secs(10), "requests", |s| {
            (s.requests.len() >= n).then_some(())
        });
    }

    pub fn vanish(&self) {
        let _ = self.control.send(Command::Vanish);
    }

    pub fn freeze(&self) {
        let _ = self.control.send(Command::Freeze);
    }

    pub fn raw(&self, frame: &str) {
        let _ = self.control.send(Command::Raw(frame.to_owned()));
    }
}

/// A user and a `devices:connect` token: (token, token id, user id).
pub fn device_token(stack: &Stack, user: &str, scopes: &[&str]) -> (String, String, String) {
    let _ = stack.admin_raw("users/add", json!({"name": user}));
    let created = stack.admin("tokens/create", json!({"user": user, "scopes": scopes}));
    (
        created["token"].as_str().unwrap().to_owned(),
        created["info"]["id"].as_str().unwrap().to_owned(),
        created["info"]["user_id"].as_str().unwrap().to_owned(),
    )
}
