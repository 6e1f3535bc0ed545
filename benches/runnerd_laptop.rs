//! The laptop row: a tool call that a chat bound to a laptop folder makes, from a coding CLI
//! through the bridge against the model loop's same call, both going to the same real laptop.
//!
//! One stack on a temp state root: workspaced, agentd (its `[agentd.model]` the runner tests'
//! scripted chat-completions server on loopback), gatewayd, runnerd with the `holder` provider
//! (a "CLI" that only leaves its environment, the bridge's URL and the turn's capability, in its
//! runtime and holds the turn open; `benches/common/runnerd.rs`), and one real
//! `agentworks executor connect` sharing a writable folder, logged in for the user `bench`.
//! Two chats of `bench` on the code project `bench`, both bound to that folder through the
//! public API (`PUT /v1/chats/{id}/binding` with the confirmation):
//!
//! - the CLI's: a chat of agent `holder`, a turn started with `POST /v1/chats/{id}/turns`
//!   (its event stream read in the background); once the holder has written `bridge.env`, each
//!   timed call is one `execute_shell_command {command: "true"}` posted to runnerd's bridge
//!   endpoint with the turn's capability, as the CLI's `agentworks-mcpbridge` posts it
//!   ([`Forwarder`]): runnerd → agentd (its bridge call: the role re-checked, the dispatch) →
//!   gatewayd → the executor, its receipt and its sandbox → back. Timed from the post to the
//!   reply.
//! - the model loop's: an `api` chat whose turns the scripted model fills with sequential
//!   calls of the same tool with the same arguments; each is timed as the gap between its
//!   `tool_call` and `tool_result` events as this process reads them off the turn's stream (what
//!   agentd spends on it: the role check, the dispatch, the laptop's round trip, storing the
//!   result).
//!
//! The two sides alternate in rounds of [`ROUND`] calls (a model-loop turn a round), so both
//! see the same load; the first round is the warm-up. The difference of the p50s is what the bridge adds (runnerd's endpoint, its call to agentd,
//! the HTTP of the post itself). A benchmark: nothing is asserted about timings; it panics only
//! when a call fails or the stack does not start.
//!
//! Run: `cargo bench --bench runnerd_laptop` (optionally `-- N` timed calls per side, rounded
//! up to whole rounds; default 20).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The test harness's daemon helpers; this benchmark uses part of them.
#[allow(dead_code)]
#[path = "../tests/common/daemons.rs"]
mod daemons;
// The stack and the laptop; this benchmark leaves gatewayd's health unread.
#[allow(dead_code)]
#[path = "common/gateway.rs"]
mod gateway;
#[path = "../tests/common/laptop_cli.rs"]
mod laptop_cli;
#[allow(dead_code)]
#[path = "common/measure.rs"]
mod measure;
#[path = "../tests/common/ports.rs"]
mod ports;
#[allow(dead_code)]
#[path = "common/runnerd.rs"]
mod runnerd;
#[path = "../crates/runner/tests/support/mod.rs"]
mod support;

use agentworks_runner::bridge::BridgeCall;
use agentworks_runner::bridge::client::Forwarder;
use bytes::Bytes;
use gateway::{Laptop, Stack, start_executor, wait_online};
use http_body_util::{BodyExt, Full};
use measure::{Stats, ms, stats};
use runnerd::HeldTurn;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;
use support::chat_completions::{Reply, ScriptedChat};

/// Calls a side makes in a row before the other side's; the first round is the warm-up.
const ROUND: usize = 5;
/// What `PUT /v1/chats/{id}/binding` must be sent, word for word.
const CONFIRM: &str = "I understand file contents and command output go to the server and the model, and commands can reach the network";

fn main() {
    let n = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(20);
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-laptop");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // Rounds of ROUND calls on each side, alternating, so both see the same load; the first
    // round is the warm-up. A model-loop turn a round: ROUND calls, one a tool round, then its
    // answer.
    let rounds = n.div_ceil(ROUND) + 1;
    let script: Vec<Reply> = (0..rounds)
        .flat_map(|r| {
            (0..ROUND)
                .map(move |i| {
                    Reply::tool(
                        "execute_shell_command",
                        &format!("call_{r}_{i}"),
                        json!({"command": "true"}),
                    )
                })
                .chain([Reply::Text("done".into())])
        })
        .collect();
    let model = runtime.block_on(ScriptedChat::start(script)).unwrap();
    let holder = runnerd::holder_cli(&base);
    let sections = format!(
        "[agentd.model]\nbase_url = \"{url}\"\nmodel = \"scripted\"\n\
         max_tool_rounds = {rounds}\nrequest_timeout_secs = 30\n\n\
         [runnerd]\nallowed_users = []\n\n\
         [runnerd.providers.holder]\ndriver = \"codex\"\nexecutable = \"{}\"\n\
         model = \"none\"\nupstream = \"{url}\"\n",
        holder.display(),
        url = model.base_url(),
        rounds = ROUND + 1,
    );
    let stack = runtime.block_on(Stack::start(&base, "", &sections));
    let _runnerd = runnerd::start_on(stack.state.path());

    let (token, user_id, connect) = runtime.block_on(async {
        stack.admin("users/add", json!({"name": "bench"})).await;
        let created = stack
            .admin(
                "tokens/create",
                json!({"user": "bench", "scopes": ["workflows:read", "workflows:write"]}),
            )
            .await;
        let (connect, user_id) = stack.device_token("bench").await.unwrap();
        let project = stack.state.path().join("documents/bench");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("server.txt"), "server file\n").unwrap();
        stack
            .admin(
                "projects/add",
                json!({"name": "bench", "kind": "code", "owner": "bench"}),
            )
            .await;
        (
            created["token"].as_str().expect("a token").to_owned(),
            user_id,
            connect,
        )
    });
    let laptop = Laptop::new(&base);
    let mut executor = start_executor(&laptop, &stack, &connect);
    let device_id = runtime.block_on(wait_online(&stack, &mut executor, &laptop, &user_id));
    let api = Api {
        port: stack.agentd_port,
        token,
    };

    let (bridge, model_loop) = runtime.block_on(async {
        let cli_chat = api.bound_chat("holder", &device_id).await;
        let api_chat = api.bound_chat("api", &device_id).await;
        let cli_turn = tokio::spawn(api.turn(cli_chat, "hold the turn open"));
        let held = tokio::task::spawn_blocking({
            let state = stack.state.path().to_owned();
            move || HeldTurn::wait(&state)
        })
        .await
        .unwrap();
        let forwarder = Forwarder::new(&held.url, held.token.clone()).unwrap();
        let call = BridgeCall {
            tool: "execute_shell_command".into(),
            arguments: json!({"command": "true"}),
        };
        let (mut bridge, mut model_loop) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            for _ in 0..ROUND {
                let started = Instant::now();
                let reply = forwarder.call(&call).await;
                bridge.push(started.elapsed());
                assert!(!reply.is_error, "the bridge call failed: {}", reply.text);
                assert_ran_true(&serde_json::from_str(&reply.text).unwrap_or(Value::Null));
            }
            let events = api.turn(api_chat.clone(), "run true").await;
            for i in 0..ROUND {
                let id = format!("call_{r}_{i}");
                let at = |kind: &str| {
                    events
                        .iter()
                        .find(|e| e.kind == kind && e.data["id"] == id.as_str())
                        .unwrap_or_else(|| panic!("no {kind} of {id} in the turn: {events:?}"))
                };
                let (called, result) = (at("tool_call"), at("tool_result"));
                assert_eq!(result.data["ok"], true, "{id} failed: {}", result.data);
                assert_ran_true(&result.data["result"]);
                model_loop.push(result.at.duration_since(called.at));
            }
        }
        held.stop();
        let events = cli_turn.await.unwrap();
        assert!(
            events.last().is_some_and(|e| e.kind == "end"),
            "the CLI's turn did not end: {:?}",
            events.last()
        );
        (bridge.split_off(ROUND), model_loop.split_off(ROUND))
    });
    if let Some(status) = executor.exited() {
        panic!("the executor exited during the run: {status}");
    }
    drop(executor);
    drop(laptop);
    drop(_runnerd);
    drop(stack);
    drop(model);
    drop(runtime);
    let _ = std::fs::remove_dir_all(&base);

    let (bridge, model_loop) = (stats(bridge), stats(model_loop));
    println!(
        "a bound chat's execute_shell_command of `true` on the laptop (executor, gatewayd, agentd, \
         runnerd on one machine, {} cores), {} timed calls each after {ROUND} warm-up, \
         alternating in rounds of {ROUND}",
        std::thread::available_parallelism().map_or(0, |p| p.get()),
        bridge.count
    );
    println!("                                                 p50 ms    p99 ms   mean ms");
    for (label, s) in [
        ("CLI: the bridge's post to runnerd, to its reply", &bridge),
        ("model loop: tool_call to tool_result", &model_loop),
    ] {
        row(label, s);
    }
    println!(
        "  {:<47}{:>+8.3}  {:>+8.3}",
        "the bridge adds",
        ms(bridge.p50) - ms(model_loop.p50),
        ms(bridge.p99) - ms(model_loop.p99),
    );
    println!("reproduce: cargo bench --bench runnerd_laptop -- {n}");
}

fn row(label: &str, s: &Stats) {
    println!(
        "  {label:<47}{:>8.3}  {:>8.3}  {:>8.3}",
        ms(s.p50),
        ms(s.p99),
        ms(s.mean)
    );
}

/// A shell command's result ran `true` to exit code 0.
fn assert_ran_true(result: &Value) {
    assert_eq!(
        result["exit_code"], 0,
        "the laptop did not run `true` to exit 0: {result}"
    );
}

/// One event of a turn's stream, stamped when this process read it.
#[derive(Debug)]
struct Event {
    kind: String,
    data: Value,
    at: Instant,
}

/// agentd's public API on 127.0.0.1 as `bench`.
#[derive(Clone)]
struct Api {
    port: u16,
    token: String,
}

impl Api {
    /// One request on a fresh connection; the response with its body unread.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: &Value,
    ) -> hyper::Response<hyper::body::Incoming> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        sender
            .send_request(request)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A JSON request; panics unless the status is `expected`.
    async fn json(&self, method: &str, path: &str, body: Value, expected: u16) -> Value {
        let response = self.send(method, path, &body).await;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let answer = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        assert_eq!(status, expected, "{method} {path}: {answer}");
        answer
    }

    /// A new chat of `agent` on the project `bench`, bound to the device's folder `proj`.
    async fn bound_chat(&self, agent: &str, device_id: &str) -> String {
        let chat = self
            .json(
                "POST",
                "/v1/chats",
                json!({"project": "bench", "agent": agent}),
                201,
            )
            .await;
        let chat = chat["chat_id"].as_str().expect("a chat id").to_owned();
        self.json(
            "PUT",
            &format!("/v1/chats/{chat}/binding"),
            json!({"device_id": device_id, "folder": "proj", "confirm": CONFIRM}),
            200,
        )
        .await;
        chat
    }

    /// A turn of `chat` read to its end; each event stamped as it arrives.
    fn turn(
        &self,
        chat: String,
        message: &str,
    ) -> impl std::future::Future<Output = Vec<Event>> + Send + 'static {
        let (api, body) = (self.clone(), json!({"message": message}));
        async move {
            let path = format!("/v1/chats/{chat}/turns");
            let response = api.send("POST", &path, &body).await;
            assert_eq!(response.status(), 200, "POST {path}");
            let mut body = response.into_body();
            // Bytes, not text: a frame may end inside a character.
            let (mut pending, mut events) = (Vec::<u8>::new(), Vec::new());
            while let Some(frame) = body.frame().await {
                let at = Instant::now();
                let Ok(data) = frame.unwrap().into_data() else {
                    continue;
                };
                pending.extend_from_slice(&data);
                while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                    let block: Vec<u8> = pending.drain(..end + 2).collect();
                    let block = String::from_utf8_lossy(&block);
                    let field = |name: &str| {
                        block
                            .lines()
                            .find_map(|l| l.strip_prefix(name))
                            .unwrap_or_default()
                            .to_owned()
                    };
                    events.push(Event {
                        kind: field("event: "),
                        data: serde_json::from_str(&field("data: ")).unwrap_or(Value::Null),
                        at,
                    });
                }
            }
            events
        }
    }
}
