//! The agent end to end: real agentd, workspaced and gatewayd, a real `agentworks executor
//! connect` where a test needs a laptop, and a scripted OpenAI-compatible model server on
//! loopback (hyper, in this file) that plays back tool calls and text and records every request
//! it was sent, so the tests can check the tool lists and the tool results the model received.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use super::harness::{Gatewayd, Laptop, Stack, http, processes_with, wait_until};

pub(super) const WAIT: Duration = Duration::from_secs(20);
pub(super) const CONFIRM: &str = "I understand file contents and command output go to the server and the model, and commands can reach the network";
const OUTSIDE: &str = "outside-secret-91c2";

// ----- the scripted model -----

/// One scripted answer: a pause, then the chat-completion body.
type Step = (Duration, Value);

/// A scripted OpenAI-compatible chat-completions server on loopback.
pub(super) struct Model {
    port: u16,
    script: Arc<Mutex<VecDeque<Step>>>,
    requests: Arc<Mutex<Vec<Value>>>,
    /// The `Authorization` header of every request, in order.
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
    /// Answer JSON whatever the request asks.
    plain: Arc<AtomicBool>,
    /// The request (its number in `requests`, from 1) whose answer waits for [`Hold::release`].
    held: Held,
    _runtime: tokio::runtime::Runtime,
}

/// Which request's answer is held, and the gate it waits at.
type Held = Arc<Mutex<Option<(usize, Arc<tokio::sync::Semaphore>)>>>;

/// The answer to one model request, held back until the test releases it
/// ([`Model::hold_answer`]): the test acts between two rounds of a turn.
pub(super) struct Hold(Arc<tokio::sync::Semaphore>);

impl Hold {
    pub(super) fn release(&self) {
        self.0.add_permits(1);
    }
}

pub(super) fn text(t: &str) -> Value {
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}]})
}

/// A step answered as a failing endpoint answers: HTTP `status` with `body` as plain text.
pub(super) fn http_error(status: u16, body: &str) -> Value {
    json!({HTTP_ERROR: status, "body": body})
}

/// `step` with the `usage` a model reports for it.
pub(super) fn with_usage(mut step: Value, prompt: u64, completion: u64) -> Value {
    step["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion});
    step
}

pub(super) fn calls(list: &[(&str, &str, Value)]) -> Value {
    let calls: Vec<Value> = list
        .iter()
        .map(|(id, name, args)| {
            json!({"id": id, "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": null, "tool_calls": calls},
        "finish_reason": "tool_calls"}]})
}

/// A scripted completion as an endpoint streams it: the text in pieces of a few characters,
/// each tool call's arguments in two pieces after its id and name, the usage in a last chunk,
/// then `[DONE]`; CRLF line ends, as some servers send.
fn server_sent_events(completion: &Value) -> String {
    let message = &completion["choices"][0]["message"];
    let mut chunks = Vec::new();
    if let Some(text) = message["content"].as_str() {
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(4) {
            let piece: String = piece.iter().collect();
            chunks.push(json!({"choices": [{"index": 0, "delta": {"content": piece}}]}));
        }
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        let (first, rest) = arguments.split_at(arguments.len() / 2);
        chunks.push(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index,
            "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": first}}]}}]}),
        );
        chunks.push(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index,
            "function": {"arguments": rest}}]}}]}),
        );
    }
    chunks.push(json!({"choices": [{"index": 0, "delta": {},
        "finish_reason": completion["choices"][0]["finish_reason"]}]}));
    if completion["usage"].is_object() {
        chunks.push(json!({"choices": [], "usage": completion["usage"]}));
    }
    let mut body: String = chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\r\n\r\n"))
        .collect();
    body.push_str("data: [DONE]\r\n\r\n");
    body
}

/// The key of a scripted step that streams its text as one piece and then never finishes.
const STALL: &str = "stall_after";
/// The key of a scripted step answered with an HTTP error status ([`http_error`]).
const HTTP_ERROR: &str = "http_error_status";

/// A step that streams `piece` and then stalls (an endpoint that hangs mid-answer).
fn stalled(piece: &str) -> Value {
    json!({STALL: piece})
}

type ScriptedBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

/// A streamed answer's first piece of text, then nothing more, ever.
fn stalled_stream(piece: &str) -> hyper::Response<ScriptedBody> {
    use futures_util::StreamExt;
    use http_body_util::BodyExt;
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": piece}}]});
    let first = bytes::Bytes::from(format!("data: {chunk}\r\n\r\n"));
    let body = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
        hyper::body::Frame::data(first),
    )])
    .chain(futures_util::stream::pending());
    hyper::Response::builder()
        .header("content-type", "text/event-stream")
        .body(BodyExt::boxed(http_body_util::StreamBody::new(body)))
        .unwrap()
}

/// The answer's whole text: every `text` event of a turn, joined (a streamed answer arrives in
/// pieces).
pub(super) fn answer_text(events: &[(String, Value)]) -> String {
    of_kind(events, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect()
}

impl Model {
    pub(super) fn start() -> Model {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let script: Arc<Mutex<VecDeque<Step>>> = Default::default();
        let requests: Arc<Mutex<Vec<Value>>> = Default::default();
        let authorizations: Arc<Mutex<Vec<Option<String>>>> = Default::default();
        let plain: Arc<AtomicBool> = Default::default();
        let held: Held = Default::default();
        let (s, r, a, p, h) = (
            script.clone(),
            requests.clone(),
            authorizations.clone(),
            plain.clone(),
            held.clone(),
        );
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (s, r, a, p, h) = (s.clone(), r.clone(), a.clone(), p.clone(), h.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let (s, r, a, p, h) =
                                (s.clone(), r.clone(), a.clone(), p.clone(), h.clone());
                            async move {
                                use http_body_util::BodyExt;
                                assert_eq!(req.uri().path(), "/v1/chat/completions");
                                a.lock().unwrap().push(
                                    req.headers()
                                        .get("authorization")
                                        .and_then(|v| v.to_str().ok())
                                        .map(str::to_owned),
                                );
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let value: Value = serde_json::from_slice(&body).unwrap();
                                // As real endpoints do: a streamed answer when asked for one,
                                // unless this model plays an endpoint that ignores `stream`.
                                let streamed = value["stream"] == true && !p.load(Ordering::SeqCst);
                                let number = {
                                    let mut requests = r.lock().unwrap();
                                    requests.push(value);
                                    requests.len()
                                };
                                let hold = h
                                    .lock()
                                    .unwrap()
                                    .as_ref()
                                    .filter(|(n, _)| *n == number)
                                    .map(|(_, gate)| gate.clone());
                                if let Some(gate) = hold {
                                    let _ = gate.acquire().await;
                                }
                                let step = s.lock().unwrap().pop_front();
                                let (delay, answer) =
                                    step.unwrap_or((Duration::ZERO, text("(script ended)")));
                                tokio::time::sleep(delay).await;
                                if let (true, Some(piece)) = (streamed, answer[STALL].as_str()) {
                                    return Ok(stalled_stream(piece));
                                }
                                if let Some(status) = answer[HTTP_ERROR].as_u64() {
                                    let body =
                                        answer["body"].as_str().unwrap_or_default().to_owned();
                                    return Ok(hyper::Response::builder()
                                        .status(u16::try_from(status).unwrap())
                                        .header("content-type", "text/plain")
                                        .body(
                                            http_body_util::Full::new(bytes::Bytes::from(body))
                                                .boxed(),
                                        )
                                        .unwrap());
                                }
                                let (content_type, body) = if streamed {
                                    ("text/event-stream", server_sent_events(&answer))
                                } else {
                                    ("application/json", answer.to_string())
                                };
                                Ok::<_, std::convert::Infallible>(
                                    hyper::Response::builder()
                                        .header("content-type", content_type)
                                        .body(
                                            http_body_util::Full::new(bytes::Bytes::from(body))
                                                .boxed(),
                                        )
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Model {
            port,
            script,
            requests,
            authorizations,
            plain,
            held,
            _runtime: runtime,
        }
    }

    /// The answer to the `number`th request (counted from 1 since the last [`Model::clear`])
    /// waits until the [`Hold`] is released.
    pub(super) fn hold_answer(&self, number: usize) -> Hold {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        *self.held.lock().unwrap() = Some((number, gate.clone()));
        Hold(gate)
    }

    /// From now on, answer JSON even when a request asks for a stream (an endpoint that
    /// ignores `stream`).
    pub(super) fn ignore_stream(&self) {
        self.plain.store(true, Ordering::SeqCst);
    }

    /// The base URL agentd is configured with (`[agentd.model] base_url`).
    pub(super) fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    pub(super) fn authorizations(&self) -> Vec<Option<String>> {
        self.authorizations.lock().unwrap().clone()
    }

    pub(super) fn config(&self) -> String {
        format!(
            "[agentd.model]\nbase_url = \"{}\"\nmodel = \"scripted\"\nmax_tool_rounds = 4\nrequest_timeout_secs = 30\n",
            self.base_url()
        )
    }

    pub(super) fn play(&self, steps: Vec<Value>) {
        let mut script = self.script.lock().unwrap();
        script.clear();
        script.extend(steps.into_iter().map(|s| (Duration::ZERO, s)));
    }

    pub(super) fn play_slowly(&self, delay: Duration, step: Value) {
        self.script.lock().unwrap().push_back((delay, step));
    }

    pub(super) fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }

    pub(super) fn clear(&self) {
        self.requests.lock().unwrap().clear();
    }
}

/// The tool names of one recorded model request.
pub(super) fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The tool results (parsed `content`) the model received in one request, by call id.
pub(super) fn tool_results(request: &Value) -> Vec<(String, Value)> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                serde_json::from_str(m["content"].as_str().unwrap()).unwrap(),
            )
        })
        .collect()
}

// ----- the REST API -----

pub(super) fn api(
    stack: &Stack,
    token: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let (status, _, text) = http(
        stack.port,
        method,
        path,
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &body,
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A turn's events: (kind, data), after checking the content type.
pub(super) fn turn(
    port: u16,
    token: &str,
    chat: &str,
    message: &str,
) -> Result<Vec<(String, Value)>, (u16, Value)> {
    let auth = format!("Bearer {token}");
    let (status, headers, text) = http(
        port,
        "POST",
        &format!("/v1/chats/{chat}/turns"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &json!({"message": message}).to_string(),
    );
    if status != 200 {
        return Err((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ));
    }
    assert_eq!(headers["content-type"], "text/event-stream");
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let mut lines = block.lines();
        let kind = lines.next().unwrap().strip_prefix("event: ").unwrap();
        let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
        events.push((kind.to_owned(), serde_json::from_str(data).unwrap()));
    }
    assert_eq!(events.last().unwrap().0, "end", "{events:?}");
    Ok(events)
}

pub(super) fn of_kind<'a>(events: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|(k, _)| k == kind)
        .map(|(_, v)| v)
        .collect()
}

pub(super) fn result_of<'a>(events: &'a [(String, Value)], id: &str) -> &'a Value {
    events
        .iter()
        .find(|(k, v)| k == "tool_result" && v["id"] == id)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no tool_result {id}: {events:?}"))
}

/// A person with a workflows token.
pub(super) fn user(stack: &Stack, name: &str) -> String {
    let _ = stack.admin_raw("users/add", json!({"name": name}));
    stack.token(name, &["workflows:read", "workflows:write"], json!({}))
}

pub(super) fn code_project(stack: &Stack, name: &str, owner: &str, files: &[(&str, &str)]) {
    stack.state.project(name, files);
    stack.admin(
        "projects/add",
        json!({"name": name, "kind": "code", "owner": owner}),
    );
}

pub(super) fn create_chat(stack: &Stack, token: &str, project: &str) -> String {
    let (status, chat) = api(
        stack,
        token,
        "POST",
        "/v1/chats",
        json!({"project": project}),
    );
    assert_eq!(status, 201, "{chat}");
    chat["chat_id"].as_str().unwrap().to_owned()
}

// ----- a laptop (harness::Laptop, as in tests/suite/laptop.rs) -----

/// alice's laptop: `~/src/repo` (shared writable) and `~/src/outside.txt` (not shared).
fn alice_laptop() -> Laptop {
    Laptop::new(
        "aw-agent-laptop-",
        &[
            ("src/repo/a.txt", "one\ntwo\nthree\n"),
            ("src/outside.txt", OUTSIDE),
        ],
    )
}

/// What these tests do with the laptop of [`alice_laptop`].
pub(super) trait LaptopExt {
    /// The shared folder, `~/src/repo`.
    fn repo(&self) -> PathBuf;
    /// `agentworks executor connect` sharing [`LaptopExt::repo`] writable.
    fn connect(&self) -> Executor;
}

impl LaptopExt for Laptop {
    fn repo(&self) -> PathBuf {
        self.folder("repo")
    }
    fn connect(&self) -> Executor {
        let repo = self.repo();
        let child = self
            .command(&[
                "executor",
                "connect",
                "--name",
                "laptop",
                "--write-folder",
                repo.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Executor { child }
    }
}

/// A running `agentworks executor connect`, killed on drop.
pub(super) struct Executor {
    pub(super) child: Child,
}

impl Executor {
    fn kill(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Everything real: alice with a code project `app`, her laptop sharing `repo` (writable).
/// Fields drop in order: the executor first, then gatewayd, then the stack.
pub(super) struct Setup {
    pub(super) executor: Option<Executor>,
    pub(super) gw: Gatewayd,
    pub(super) stack: Stack,
    pub(super) model: Model,
    pub(super) laptop: Laptop,
    pub(super) alice: String,
    pub(super) device_id: String,
}

impl Setup {
    pub(super) fn start(with_executor: bool) -> Setup {
        Setup::start_with(with_executor, "")
    }

    /// [`Setup::start`] with `agentd_extra` (keys of `[agentd]`) in agentd's config.
    pub(super) fn start_with(with_executor: bool, agentd_extra: &str) -> Setup {
        let model = Model::start();
        let (stack, gw_port) =
            Stack::start_with_gateway_and(&format!("{agentd_extra}\n{}", model.config()));
        let gw = Gatewayd::start(&stack, gw_port);
        let alice = user(&stack, "alice");
        code_project(&stack, "app", "alice", &[("server.txt", "server file\n")]);
        let laptop = alice_laptop();
        let mut setup = Setup {
            executor: None,
            gw,
            stack,
            model,
            laptop,
            alice,
            device_id: String::new(),
        };
        if with_executor {
            let connect = setup.stack.token("alice", &["devices:connect"], json!({}));
            setup.laptop.login(&setup.stack, gw_port, &connect);
            setup.executor = Some(setup.laptop.connect());
            let device = setup.wait_device(true);
            setup.device_id = device["device_id"].as_str().unwrap().to_owned();
        }
        setup
    }

    /// `agentworks chat --project app --server … <args>` as alice (her token in
    /// `AGENTWORKS_TOKEN`), with `home` as its HOME and XDG dirs.
    pub(super) fn chat_cli(&self, home: &std::path::Path, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentworks"));
        command
            .args(["chat", "--project", "app", "--server"])
            .arg(format!("http://127.0.0.1:{}", self.stack.port))
            .args(args)
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("XDG_STATE_HOME", home.join("state"))
            .env("AGENTWORKS_TOKEN", &self.alice);
        command
    }

    /// [`Setup::chat_cli`] run to its end with `stdin` typed in (then closed).
    pub(super) fn run_chat(
        &self,
        home: &std::path::Path,
        args: &[&str],
        stdin: &str,
    ) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .chat_cli(home, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// alice's device as `GET /v1/devices` lists it, once its online state is `online`.
    pub(super) fn wait_device(&self, online: bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, body) = api(&self.stack, &self.alice, "GET", "/v1/devices", Value::Null);
            assert_eq!(status, 200, "{body}");
            if let Some(device) = body["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["online"] == online)
            {
                return device.clone();
            }
            assert!(
                Instant::now() < deadline,
                "the device's online state never became {online}: {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub(super) fn bind(&self, chat: &str) -> (u16, Value) {
        api(
            &self.stack,
            &self.alice,
            "PUT",
            &format!("/v1/chats/{chat}/binding"),
            json!({"device_id": self.device_id, "folder": "repo", "confirm": CONFIRM}),
        )
    }

    fn server_file(&self) -> String {
        std::fs::read_to_string(self.stack.state.documents().join("app/server.txt")).unwrap()
    }
}

const PATCH: &str = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n";

#[test]
fn a_bound_turn_runs_a_command_and_a_patch_on_the_laptop_and_the_model_gets_the_results() {
    let setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");

    // The device and its folder are listed to alice with the folder's access.
    let device = setup.wait_device(true);
    assert_eq!(device["folders"][0]["alias"], "repo", "{device}");
    assert_eq!(device["folders"][0]["access"], "read_write", "{device}");

    // Binding needs the exact confirmation, which the refusal carries.
    for confirm in [Value::Null, json!("yes"), json!(CONFIRM.to_lowercase())] {
        let (status, body) = api(
            &setup.stack,
            &setup.alice,
            "PUT",
            &format!("/v1/chats/{chat}/binding"),
            json!({"device_id": setup.device_id, "folder": "repo", "confirm": confirm}),
        );
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "consequences_not_confirmed");
        assert!(body["error"]["message"].as_str().unwrap().contains(CONFIRM));
    }
    // Only alice's device and a folder it shares.
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "PUT",
        &format!("/v1/chats/{chat}/binding"),
        json!({"device_id": setup.device_id, "folder": "nope", "confirm": CONFIRM}),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("folder_not_shared"))
    );
    let (status, bound) = setup.bind(&chat);
    assert_eq!(status, 200, "{bound}");
    assert_eq!(bound["binding"]["device_id"], setup.device_id.as_str());
    assert_eq!(bound["binding"]["folder"], "repo");

    setup.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": "cat a.txt; echo made > made.txt"}),
        )]),
        calls(&[(
            "c2",
            "diff_patch_workspace_file",
            json!({"filepath": "a.txt", "diff": PATCH}),
        )]),
        // A server tool does not exist in a bound turn.
        calls(&[(
            "c3",
            "write_file",
            json!({"path": "server.txt", "content": "x", "expected_revision": "missing"}),
        )]),
        text("Patched a.txt."),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "fix a.txt").unwrap();
    let mut names: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    // The streamed answer's pieces count as one.
    names.dedup_by(|a, b| *a == "text" && *b == "text");
    assert_eq!(
        names,
        [
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "text",
            "end"
        ],
        "{events:?}"
    );
    assert_eq!(of_kind(&events, "end")[0]["reason"], "completed");
    assert_eq!(
        of_kind(&events, "tool_call")[0]["arguments"]["command"],
        "cat a.txt; echo made > made.txt"
    );
    let c1 = result_of(&events, "c1");
    assert_eq!(c1["ok"], true, "{c1}");
    assert_eq!(c1["result"]["stdout"], "one\ntwo\nthree\n");
    assert_eq!(c1["result"]["exit_code"], 0);
    assert_eq!(result_of(&events, "c2")["ok"], true, "{events:?}");
    let c3 = result_of(&events, "c3");
    assert_eq!(
        (c3["ok"].clone(), c3["error"]["code"].clone()),
        (json!(false), json!("unknown_tool"))
    );

    // The laptop folder changed; the server's project did not.
    assert_eq!(
        std::fs::read_to_string(setup.laptop.repo().join("a.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        std::fs::read_to_string(setup.laptop.repo().join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(setup.server_file(), "server file\n");
    assert!(!setup.stack.state.documents().join("app/made.txt").exists());

    // The model saw exactly the two local tools every time, and received the results.
    let requests = setup.model.requests();
    assert_eq!(requests.len(), 4);
    for request in &requests {
        assert_eq!(
            tool_names(request),
            ["execute_shell_command", "diff_patch_workspace_file"]
        );
        let schema = request["tools"].to_string();
        assert!(
            !schema.contains("device") && !schema.contains("request_id"),
            "{schema}"
        );
    }
    let results = tool_results(&requests[3]);
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].0, "c1");
    assert_eq!(results[0].1["result"]["stdout"], "one\ntwo\nthree\n");
    assert_eq!(results[1].1["ok"], true);
    assert_eq!(
        results[1].1["result"]["files"][0]["path"], "a.txt",
        "{}",
        results[1].1
    );
    assert_eq!(results[2].1["error"]["code"], "unknown_tool");

    // The request ids were made by the server, per chat, turn and call.
    let alice_id = setup
        .stack
        .admin("users/list", json!({}))
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "alice")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let outcome = setup
        .gw
        .client()
        .json(
            "/v1/outcome",
            json!({"user_id": alice_id, "request_id": format!("chat-{chat}-turn-1-call-2")}),
        )
        .unwrap();
    assert_eq!(outcome["outcome"]["status"], "patched", "{outcome}");

    // The conversation is stored: user, assistant and tool messages, in order.
    let (status, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(status, 200);
    let roles: Vec<&str> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
}

#[test]
fn paths_outside_the_bound_folder_are_refused_by_the_executor() {
    let setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    assert_eq!(setup.bind(&chat).0, 200);
    let outside_patch =
        format!("--- a/../outside.txt\n+++ b/../outside.txt\n@@ -1 +1 @@\n-{OUTSIDE}\n+changed\n");
    setup.model.play(vec![
        calls(&[
            (
                "p1",
                "diff_patch_workspace_file",
                json!({"filepath": "../outside.txt", "diff": outside_patch}),
            ),
            (
                "s1",
                "execute_shell_command",
                json!({"command": "cat ../outside.txt"}),
            ),
            (
                "s2",
                "execute_shell_command",
                json!({"command": "echo changed > ../outside.txt"}),
            ),
            // The model cannot pick a device or folder: extra arguments are refused.
            (
                "d1",
                "execute_shell_command",
                json!({"command": "ls", "device_id": "other", "folder": "x"}),
            ),
        ]),
        text("done"),
    ]);
    let events = turn(
        setup.stack.port,
        &setup.alice,
        &chat,
        "read the file next to the folder",
    )
    .unwrap();
    let p1 = result_of(&events, "p1");
    assert_eq!(p1["ok"], false, "{p1}");
    assert_ne!(p1["error"]["code"], "device_offline", "{p1}");
    for id in ["s1", "s2"] {
        let s = result_of(&events, id);
        assert_eq!(s["ok"], true, "{s}");
        assert_ne!(s["result"]["exit_code"], 0, "{s}");
        assert!(
            !s["result"]["stdout"].as_str().unwrap().contains(OUTSIDE),
            "{s}"
        );
    }
    assert_eq!(
        result_of(&events, "d1")["error"]["code"],
        "invalid_arguments"
    );
    assert_eq!(
        std::fs::read_to_string(setup.laptop.root().join("home/src/outside.txt")).unwrap(),
        OUTSIDE
    );
    // The model got the refusals, not the content.
    let results = tool_results(setup.model.requests().last().unwrap());
    assert_eq!(results.len(), 4);
    assert_eq!(results[0].1["ok"], false, "{results:?}");
    for (id, result) in &results {
        assert!(!result.to_string().contains(OUTSIDE), "{id}: {result}");
    }
}

#[test]
fn an_offline_device_fails_local_calls_without_falling_back_to_the_server() {
    let mut setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    assert_eq!(setup.bind(&chat).0, 200);
    setup.executor.as_mut().unwrap().kill();
    setup.wait_device(false);

    setup.model.play(vec![
        calls(&[
            ("s1", "execute_shell_command", json!({"command": "echo changed > server.txt"})),
            ("p1", "diff_patch_workspace_file", json!({"filepath": "server.txt",
                "diff": "--- a/server.txt\n+++ b/server.txt\n@@ -1 +1 @@\n-server file\n+changed\n"})),
            ("r1", "read_file", json!({"path": "server.txt"})),
        ]),
        text("the laptop is offline"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "change server.txt").unwrap();
    for id in ["s1", "p1"] {
        let r = result_of(&events, id);
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "device_offline", "{r}");
    }
    assert_eq!(result_of(&events, "r1")["error"]["code"], "unknown_tool");
    assert_eq!(of_kind(&events, "end")[0]["reason"], "completed");
    // Nothing changed on the server, and the tool list stayed the local one.
    assert_eq!(setup.server_file(), "server file\n");
    for request in setup.model.requests() {
        assert_eq!(
            tool_names(&request),
            ["execute_shell_command", "diff_patch_workspace_file"]
        );
    }
    let results = tool_results(setup.model.requests().last().unwrap());
    assert_eq!(results[0].1["error"]["code"], "device_offline");
    // The binding is kept.
    let (_, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(stored["binding"]["device_id"], setup.device_id.as_str());
}

#[test]
fn binding_changes_wait_for_the_running_turn_and_unbinding_restores_server_tools() {
    let setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    assert_eq!(setup.bind(&chat).0, 200);

    // A turn whose model answers slowly.
    setup.model.play(vec![]);
    setup
        .model
        .play_slowly(Duration::from_secs(3), text("slow answer"));
    let (port, token, id) = (setup.stack.port, setup.alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "take your time"));
    wait_until("the turn reaches the model", WAIT, || {
        !setup.model.requests().is_empty()
    });
    let path = format!("/v1/chats/{chat}/binding");
    let (status, body) = setup.bind(&chat);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("turn_running")),
        "{body}"
    );
    let (status, body) = api(&setup.stack, &setup.alice, "DELETE", &path, Value::Null);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("turn_running")),
        "{body}"
    );
    let second = turn(setup.stack.port, &setup.alice, &chat, "again").unwrap_err();
    assert_eq!(
        (second.0, second.1["error"]["code"].as_str()),
        (409, Some("turn_running"))
    );
    let events = running.join().unwrap().unwrap();
    assert_eq!(answer_text(&events), "slow answer");

    // Once the turn ended: unbind, and the next turn has the server tools again.
    let (status, body) = api(&setup.stack, &setup.alice, "DELETE", &path, Value::Null);
    assert_eq!(status, 200, "{body}");
    assert!(body["binding"].is_null());
    setup.model.clear();
    setup.model.play(vec![
        calls(&[("r1", "read_file", json!({"path": "server.txt"}))]),
        text("read it"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "read server.txt").unwrap();
    assert_eq!(
        result_of(&events, "r1")["result"]["content"],
        "server file\n",
        "{events:?}"
    );
    for request in setup.model.requests() {
        assert_eq!(
            tool_names(&request),
            ["read_file", "list_files", "search_files", "write_file"]
        );
    }
    // The second turn continued the chat: the first turn's messages were sent too.
    let first = setup.model.requests()[0]["messages"].to_string();
    assert!(
        first.contains("take your time") && first.contains("slow answer"),
        "{first}"
    );
}

#[test]
fn a_server_mode_turn_writes_through_workspaced_with_receipts() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![
        calls(&[("l1", "list_files", json!({})), ("r1", "read_file", json!({"path": "server.txt"}))]),
        calls(&[
            ("w1", "write_file", json!({"path": "notes/new.txt", "content": "written by the agent\n", "expected_revision": "missing"})),
            ("s1", "search_files", json!({"query": "server"})),
        ]),
        // The model cannot pick the project or the request id.
        calls(&[("w2", "write_file", json!({"path": "x.txt", "content": "x", "expected_revision": "missing", "workflow_id": "other", "request_id": "mine"}))]),
        text("wrote notes/new.txt"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "write a note").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:?}"
    );
    assert_eq!(
        result_of(&events, "r1")["result"]["content"],
        "server file\n"
    );
    let w1 = result_of(&events, "w1");
    assert_eq!(w1["ok"], true, "{w1}");
    assert_eq!(
        result_of(&events, "w2")["error"]["code"],
        "invalid_arguments"
    );
    assert!(!setup.stack.state.documents().join("app/x.txt").exists());
    assert_eq!(
        std::fs::read_to_string(setup.stack.state.documents().join("app/notes/new.txt")).unwrap(),
        "written by the agent\n"
    );
    let requests = setup.model.requests();
    for request in &requests {
        assert_eq!(
            tool_names(request),
            ["read_file", "list_files", "search_files", "write_file"]
        );
    }
    let results = tool_results(&requests[2]);
    assert_eq!(results[2].0, "w1");
    assert_eq!(
        results[2].1["result"]["receipt_id"],
        w1["result"]["receipt_id"]
    );

    // The receipt, under the server-made request id, names alice and the agent.
    let request_id = format!("chat-{chat}-turn-1-call-3");
    let receipt = setup.stack.admin(
        "receipts/show",
        json!({"project": "app", "request_id": request_id, "user": "alice"}),
    );
    let text = receipt.to_string();
    assert!(
        text.contains(w1["result"]["receipt_id"].as_str().unwrap()),
        "{text}"
    );
    assert!(
        text.contains("notes/new.txt") && text.contains("\"agent\""),
        "{text}"
    );
}

#[test]
fn only_the_chats_creator_reads_it_and_runs_turns_in_it() {
    let setup = Setup::start(false);
    let alice = &setup.alice;
    let chat = create_chat(&setup.stack, alice, "app");
    let bob = user(&setup.stack, "bob");
    setup.stack.admin(
        "members/add",
        json!({"project": "app", "user": "bob", "role": "co-owner"}),
    );
    let mallory = user(&setup.stack, "mallory");
    setup.model.play(vec![text("hi")]);

    // Another member (a co-owner) is refused; an outsider does not learn the chat exists.
    let (status, body) = turn(setup.stack.port, &bob, &chat, "hello").unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("chat_not_yours")),
        "{body}"
    );
    let (status, _) = turn(setup.stack.port, &mallory, &chat, "hello").unwrap_err();
    assert_eq!(status, 404);
    for token in [&bob, &mallory] {
        let (status, _) = api(
            &setup.stack,
            token,
            "GET",
            &format!("/v1/chats/{chat}"),
            Value::Null,
        );
        assert_eq!(status, 404);
        let (status, _) = api(
            &setup.stack,
            token,
            "DELETE",
            &format!("/v1/chats/{chat}/binding"),
            Value::Null,
        );
        assert_eq!(status, 404);
    }
    let (status, list) = api(
        &setup.stack,
        &bob,
        "GET",
        "/v1/chats?project=app",
        Value::Null,
    );
    assert_eq!((status, list["chats"].as_array().unwrap().len()), (200, 0));
    let (status, _) = api(
        &setup.stack,
        &mallory,
        "POST",
        "/v1/chats",
        json!({"project": "app"}),
    );
    assert_eq!(status, 404);
    assert!(setup.model.requests().is_empty());

    // Tokens: devices:connect is the wrong scope, garbage is no token.
    let connect = setup.stack.token("alice", &["devices:connect"], json!({}));
    let (status, body) = api(&setup.stack, &connect, "GET", "/v1/chats", Value::Null);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("insufficient_scope"))
    );
    let (status, _) = api(&setup.stack, "nope", "GET", "/v1/chats", Value::Null);
    assert_eq!(status, 401);

    // Only code projects have chats.
    setup.stack.admin(
        "projects/add",
        json!({"name": "flows", "kind": "workflow", "owner": "alice"}),
    );
    let (status, body) = api(
        &setup.stack,
        alice,
        "POST",
        "/v1/chats",
        json!({"project": "flows"}),
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("not_a_code_project")),
        "{body}"
    );

    // The owner's turn runs; the chat is listed to her.
    let events = turn(setup.stack.port, alice, &chat, "hello").unwrap();
    assert_eq!(answer_text(&events), "hi");
    let (_, list) = api(
        &setup.stack,
        alice,
        "GET",
        "/v1/chats?project=app",
        Value::Null,
    );
    assert_eq!(list["chats"][0]["chat_id"], chat.as_str());
    assert_eq!(list["chats"][0]["turns"], 1);
}

/// A turn's event stream read as it arrives, over a plain socket (so a test can act between
/// events): what came so far is in `received`.
struct TurnStream {
    stream: std::net::TcpStream,
    received: String,
}

impl TurnStream {
    fn open(port: u16, token: &str, chat: &str, message: &str) -> TurnStream {
        use std::io::Write;
        let body = json!({"message": message}).to_string();
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            stream,
            "POST /v1/chats/{chat}/turns HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        TurnStream {
            stream,
            received: String::new(),
        }
    }

    /// Reads until `what` has arrived; fails if the stream ends first.
    fn read_until(&mut self, what: &str) {
        use std::io::Read;
        let mut buffer = [0u8; 4096];
        while !self.received.contains(what) {
            let n = self.stream.read(&mut buffer).unwrap();
            assert!(n > 0, "the stream ended before {what}: {}", self.received);
            self.received
                .push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    }
}

/// The turn's events reach the caller while the turn is still running, not all at its end.
#[test]
fn turn_events_stream_while_the_turn_runs() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![calls(&[(
        "r1",
        "read_file",
        json!({"path": "server.txt"}),
    )])]);
    setup
        .model
        .play_slowly(Duration::from_secs(4), text("done after a while"));
    let mut stream = TurnStream::open(setup.stack.port, &setup.alice, &chat, "read it");
    stream.read_until("event: tool_result");
    assert!(
        !stream.received.contains("event: end"),
        "{}",
        stream.received
    );
    // The tool result arrived and the turn is provably still running: binding is refused.
    let (status, refused) = setup.bind(&chat);
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "turn_running");
    stream.read_until("event: end");
    // The answer's first streamed piece.
    assert!(
        stream.received.contains(r#"{"text":"done"}"#),
        "{}",
        stream.received
    );
}

/// `agentworks chat`: the terminal client binds after confirmation, folds tool calls to a line
/// each, shows the model's text, and unbinds.
#[test]
fn the_terminal_client_binds_shows_a_turn_and_unbinds() {
    let setup = Setup::start(true);
    setup.model.play(vec![
        calls(&[("c1", "execute_shell_command", json!({"command": "echo hi"}))]),
        text("all done"),
    ]);
    let chat_cli = |stdin: &str, extra: &[&str]| {
        let home = tempfile::tempdir().unwrap();
        setup.run_chat(home.path(), &[&["--local", "repo"], extra].concat(), stdin)
    };
    let chats = || {
        let (status, body) = api(&setup.stack, &setup.alice, "GET", "/v1/chats", Value::Null);
        assert_eq!(status, 200, "{body}");
        body["chats"].as_array().unwrap().len()
    };
    // Without a "yes" nothing is bound, and (issue 43, item 7) no chat is left behind: the
    // folder is found and confirmed before the chat is created.
    let refused = chat_cli("no\n", &[]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("consequences"), "{said}");
    assert!(said.contains("not bound"), "{said}");
    assert!(said.contains("no chat was started"), "{said}");
    assert_eq!(chats(), 0, "a refused binding left a chat");
    // A folder no device shares: refused before any chat exists.
    let home = tempfile::tempdir().unwrap();
    let wrong = setup.run_chat(home.path(), &["--local", "nope", "--yes"], "hello\n");
    assert!(!wrong.status.success());
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        said.contains("no device of yours shares a folder named \"nope\"")
            && said.contains("laptop:repo")
            && said.contains("no chat was started"),
        "{said}"
    );
    assert_eq!(chats(), 0, "a wrong --local left an empty chat");

    let out = chat_cli("run it\n/unbind\n/quit\n", &["--yes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("bound to "), "{stdout}");
    assert!(
        stdout.contains("✓ execute_shell_command echo hi — exit 0, 1 line of output"),
        "{stdout}"
    );
    assert!(stdout.contains("agent> all done"), "{stdout}");
    assert!(stdout.contains("unbound: server files"), "{stdout}");
    assert_eq!(chats(), 1);
    // The command really ran on the laptop: the model got its output.
    let results = tool_results(&setup.model.requests()[1]);
    assert!(results[0].1.to_string().contains("hi"), "{results:?}");
}

/// Issue 42 item 10. `agentworks chat` printed the model's text, a tool call's arguments and
/// a command's output raw: OSC 52 wrote the clipboard, and cursor movement (CSI `A`, a
/// carriage return, erase-line) went back over a printed line to fake a ✓ tool line. Here the
/// model's text, a command the model chose and a failing command's stderr carry such
/// sequences and U+202E, in a live turn and when the chat is resumed: none of their control
/// characters reaches the client's stdout, and what they said is still shown.
#[test]
fn the_terminal_client_never_prints_a_control_sequence_from_the_model_or_a_command() {
    const CLIPBOARD: &str = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07";
    const FAKE_TICK: &str = "\x1b[2A\r\x1b[2K  ✓ execute_shell_command rm -rf ~ — exit 0";
    let setup = Setup::start(true);
    setup.model.play(vec![
        calls(&[
            (
                "c1",
                "execute_shell_command",
                json!({"command": format!("echo listed # {FAKE_TICK}")}),
            ),
            (
                "c2",
                "execute_shell_command",
                json!({"command": "printf '\\033]52;c;ZXZpbA==\\007\\033[1A\\033[2K\\302\\233H fine\\n' >&2; exit 3"}),
            ),
        ]),
        text(&format!("Here you go.{CLIPBOARD}{FAKE_TICK}\u{202e}\u{9b}2J done")),
    ]);
    let home = tempfile::tempdir().unwrap();
    let chat_cli = |stdin: &str, extra: &[&str]| {
        let out = setup.run_chat(home.path(), extra, stdin);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let assert_clean = |stdout: &str| {
        let raw: Vec<char> = stdout
            .chars()
            .filter(|&c| c != '\n' && agentworks_core::text::is_control_or_bidi(c))
            .collect();
        assert!(raw.is_empty(), "{raw:?} reached the terminal: {stdout:?}");
    };
    let live = chat_cli("show me\n/quit\n", &["--local", "repo", "--yes"]);
    assert_clean(&live);
    // Shown, without their control characters.
    assert!(live.contains("agent> Here you go.]52;c;"), "{live}");
    assert!(
        live.contains(
            "  ✓ execute_shell_command echo listed # [2A[2K  ✓ execute_shell_command rm -rf ~"
        ),
        "{live}"
    );
    assert!(
        live.lines()
            .any(|l| l.starts_with("  ✗ execute_shell_command printf") && l.contains("exit 3")),
        "{live}"
    );
    // The command ran, and what it wrote reached the model as it was: only the terminal is
    // spared it.
    let results = tool_results(&setup.model.requests()[1]);
    assert!(
        results[1].1.to_string().contains("\\u001b]52;c;ZXZpbA=="),
        "{results:?}"
    );

    // Resumed: the earlier turn is shown from the server's history, as clean.
    let chats = api(&setup.stack, &setup.alice, "GET", "/v1/chats", Value::Null).1;
    let chat = chats["chats"][0]["chat_id"].as_str().unwrap().to_owned();
    let resumed = chat_cli("/quit\n", &["--chat", &chat]);
    assert_clean(&resumed);
    assert!(resumed.contains("— earlier in this chat —"), "{resumed}");
    assert!(resumed.contains("agent> Here you go.]52;c;"), "{resumed}");
}

/// Cancelling a bound turn while the laptop runs a command: the command's process is killed,
/// its result says so, the call the model asked for next is not run, the turn ends as
/// `cancelled`, and the chat is free for the next turn with a complete history.
#[test]
fn cancelling_a_bound_turn_kills_the_laptop_command_and_ends_the_turn() {
    let setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    assert_eq!(setup.bind(&chat).0, 200);
    let cancel_path = format!("/v1/chats/{chat}/cancel");

    // Nothing to cancel yet; and only the chat's creator may cancel.
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        &cancel_path,
        Value::Null,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("no_turn_running")),
        "{body}"
    );

    let sleeper = "sleep 61.25";
    setup.model.play(vec![calls(&[
        (
            "c1",
            "execute_shell_command",
            json!({"command": format!("echo started > started.txt; {sleeper}"), "timeout": 120}),
        ),
        (
            "c2",
            "execute_shell_command",
            json!({"command": "echo ran > never.txt"}),
        ),
    ])]);
    let (port, token, id) = (setup.stack.port, setup.alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "run the long thing"));
    let repo = setup.laptop.repo();
    wait_until("the command runs on the laptop", WAIT, || {
        repo.join("started.txt").exists() && !processes_with(sleeper).is_empty()
    });

    let bob = user(&setup.stack, "bob");
    let (status, _) = api(&setup.stack, &bob, "POST", &cancel_path, Value::Null);
    assert_eq!(status, 404, "someone else's chat is not theirs to cancel");
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        &cancel_path,
        Value::Null,
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["turn"], 1);

    let events = running.join().unwrap().unwrap();
    assert_eq!(
        events.last().unwrap().1["reason"],
        "cancelled",
        "{events:?}"
    );
    let first = result_of(&events, "c1");
    assert_eq!(first["ok"], true, "{first}");
    assert_eq!(first["result"]["cancelled"], true, "{first}");
    let second = result_of(&events, "c2");
    assert_eq!(second["ok"], false, "{second}");
    assert_eq!(second["error"]["code"], "cancelled", "{second}");
    assert!(
        !repo.join("never.txt").exists(),
        "a call after the cancel ran"
    );
    wait_until("the cancelled command is gone", WAIT, || {
        processes_with(sleeper).is_empty()
    });

    // The chat is free, and the next turn's history answers both calls.
    setup.model.clear();
    setup.model.play(vec![text("stopped as asked")]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "what happened?").unwrap();
    assert_eq!(
        events.last().unwrap().1["reason"],
        "completed",
        "{events:?}"
    );
    let history = &setup.model.requests()[0];
    let answered: Vec<String> = tool_results(history)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(answered, ["c1", "c2"], "{history}");
}

/// Cancelling a server-mode turn while the model thinks: the model's late answer is dropped and
/// the turn ends as `cancelled`.
#[test]
fn cancelling_a_turn_abandons_the_model_request() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![]);
    setup
        .model
        .play_slowly(Duration::from_secs(20), text("too late"));
    let (port, token, id) = (setup.stack.port, setup.alice.clone(), chat.clone());
    let running = std::thread::spawn(move || turn(port, &token, &id, "think hard"));
    wait_until("the turn reaches the model", WAIT, || {
        !setup.model.requests().is_empty()
    });
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        Value::Null,
    );
    assert_eq!(status, 202, "{body}");
    let events = running.join().unwrap().unwrap();
    assert_eq!(
        events.last().unwrap().1["reason"],
        "cancelled",
        "{events:?}"
    );
    assert!(of_kind(&events, "text").is_empty(), "{events:?}");
    let (_, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert!(!stored.to_string().contains("too late"), "{stored}");
}

/// Cancelling a turn while the model's answer streams: the text already shown is stored as the
/// model's message of the turn (a reopened chat shows it, the next turn's model sees it).
#[test]
fn cancelling_mid_stream_keeps_the_text_already_shown() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![stalled("half an answ")]);
    let mut stream = TurnStream::open(setup.stack.port, &setup.alice, &chat, "explain");
    stream.read_until("half an answ");
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        Value::Null,
    );
    assert_eq!(status, 202, "{body}");
    stream.read_until("event: end");
    assert!(
        stream.received.contains(r#""reason":"cancelled""#),
        "{}",
        stream.received
    );
    let (_, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    let assistant: Vec<&Value> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistant.len(), 1, "{stored}");
    assert_eq!(assistant[0]["content"], "half an answ", "{stored}");

    // The next turn's model request carries it.
    setup.model.clear();
    setup.model.play(vec![text("go on")]);
    turn(setup.stack.port, &setup.alice, &chat, "and then?").unwrap();
    let sent = setup.model.requests()[0]["messages"].to_string();
    assert!(sent.contains("half an answ"), "{sent}");
}

/// `agentworks chat`: Ctrl-C during a turn cancels it on the server (the command on the laptop
/// is killed) and the client shows why the turn ended; Ctrl-C at the prompt ends the chat.
#[test]
fn ctrl_c_in_the_terminal_client_cancels_the_turn_then_ends_the_chat() {
    use std::io::Write;
    let setup = Setup::start(true);
    let sleeper = "sleep 62.75";
    setup.model.play(vec![calls(&[(
        "c1",
        "execute_shell_command",
        json!({"command": format!("echo started > started.txt; {sleeper}"), "timeout": 120}),
    )])]);
    let home = tempfile::tempdir().unwrap();
    let mut child = setup
        .chat_cli(home.path(), &["--local", "repo", "--yes"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // stdin stays open: only Ctrl-C may end this chat.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"run the long thing\n").unwrap();
    let repo = setup.laptop.repo();
    wait_until("the command runs on the laptop", WAIT, || {
        repo.join("started.txt").exists() && !processes_with(sleeper).is_empty()
    });
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).unwrap();
    wait_until("Ctrl-C stopped the command", WAIT, || {
        processes_with(sleeper).is_empty()
    });
    // Once the server has ended the turn (nothing left to cancel), the client is back at the
    // prompt; give it a moment to print, then Ctrl-C there ends the chat.
    let chats = api(&setup.stack, &setup.alice, "GET", "/v1/chats", Value::Null).1;
    let chat = chats["chats"][0]["chat_id"].as_str().unwrap().to_owned();
    let cancel = format!("/v1/chats/{chat}/cancel");
    wait_until("the turn ended on the server", WAIT, || {
        api(&setup.stack, &setup.alice, "POST", &cancel, Value::Null).0 == 409
    });
    std::thread::sleep(Duration::from_millis(300));
    kill(pid, Signal::SIGINT).unwrap();
    let mut status = None;
    wait_until("Ctrl-C at the prompt ended the chat", WAIT, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    let status = status.unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    assert!(stderr.contains("cancelling the turn"), "{stderr}");
    assert!(stdout.contains("(turn ended: cancelled)"), "{stdout}");
}

/// `max_history_bytes`: a long chat sends the model only its most recent whole turns, and says
/// that earlier messages are left out.
#[test]
fn long_chats_send_only_their_recent_turns_to_the_model() {
    let model = Model::start();
    let config = format!("{}max_history_bytes = 800\n", model.config());
    let (stack, _) = Stack::start_with_gateway_and(&config);
    let alice = user(&stack, "alice");
    code_project(&stack, "app", "alice", &[("server.txt", "x\n")]);
    let chat = create_chat(&stack, &alice, "app");
    // About 330 bytes of JSON per message: two turns fit in 800 bytes, three do not.
    let long = |tag: &str| format!("{tag}-turn {}", "words ".repeat(50));
    for tag in ["first", "second", "third"] {
        model.play(vec![text(&format!("ok {tag}"))]);
        turn(stack.port, &alice, &chat, &long(tag)).unwrap();
    }
    let requests = model.requests();
    let last = &requests.last().unwrap()["messages"];
    let sent = last.to_string();
    assert!(
        sent.contains("third-turn") && sent.contains("second-turn"),
        "{sent}"
    );
    assert!(
        !sent.contains("first-turn") && !sent.contains("ok first"),
        "{sent}"
    );
    assert_eq!(
        last[1]["role"], "user",
        "the history starts at a user message: {sent}"
    );
    assert!(
        last[0]["content"]
            .as_str()
            .unwrap()
            .contains("The 2 earliest messages of this chat are not shown"),
        "{sent}"
    );
    // The stored chat keeps everything.
    let (_, stored) = api(
        &stack,
        &alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert!(stored.to_string().contains("first-turn"));
}

/// `GET /v1/projects`: the caller's projects with their kind and role; `GET /v1/models`: the
/// configured model without its key. Both need the same bearer token as the chat endpoints.
#[test]
fn projects_and_the_model_are_listed_to_a_signed_in_person() {
    let setup = Setup::start(false);
    let stack = &setup.stack;
    let (status, body) = api(stack, &setup.alice, "GET", "/v1/projects", Value::Null);
    assert_eq!(status, 200, "{body}");
    let projects = body["projects"].as_array().unwrap();
    assert_eq!(projects.len(), 1, "{body}");
    assert_eq!(
        (
            &projects[0]["name"],
            &projects[0]["kind"],
            &projects[0]["role"]
        ),
        (&json!("app"), &json!("code"), &json!("owner")),
        "{body}"
    );
    assert!(projects[0]["id"].as_str().is_some_and(|id| !id.is_empty()));
    // Someone else sees only theirs.
    let bob = user(stack, "bob");
    let (status, body) = api(stack, &bob, "GET", "/v1/projects", Value::Null);
    assert_eq!(
        (status, body["projects"].clone()),
        (200, json!([])),
        "{body}"
    );

    let (status, body) = api(stack, &bob, "GET", "/v1/models", Value::Null);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"configured": true, "model": "scripted", "base_url": setup.model.base_url()})
    );

    // The chat endpoints' authentication and methods.
    for path in ["/v1/projects", "/v1/models"] {
        let (status, _, text) = http(stack.port, "GET", path, &[], "");
        assert_eq!(status, 401, "{path}: {text}");
        assert!(text.contains("missing_token"), "{path}: {text}");
        let (status, body) = api(stack, &bob, "POST", path, json!({}));
        assert_eq!(status, 405, "{path}: {body}");
        let device_token = stack.token("bob", &["devices:connect"], json!({}));
        let (status, body) = api(stack, &device_token, "GET", path, Value::Null);
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (403, Some("insufficient_scope")),
            "{path}: {body}"
        );
    }
}

/// Token usage: every model call's `usage` is added to its turn, the sum is sent with `end`,
/// stored with the turn and listed by `GET /v1/chats/{id}` per turn and in total; a model that
/// sends no usage counts zeros.
#[test]
fn a_turns_token_usage_is_summed_sent_with_end_and_stored() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![
        with_usage(
            calls(&[("c1", "read_file", json!({"path": "server.txt"}))]),
            100,
            7,
        ),
        with_usage(text("It says server file."), 130, 9),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "read it").unwrap();
    let end = of_kind(&events, "end")[0];
    assert_eq!(end["reason"], "completed", "{events:?}");
    let first = json!({"prompt_tokens": 230, "completion_tokens": 16, "total_tokens": 246});
    assert_eq!(end["usage"], first, "{events:?}");
    let c1 = result_of(&events, "c1");
    assert_eq!(
        (&c1["state"], &c1["ok"]),
        (&json!("done"), &json!(true)),
        "{c1}"
    );

    setup.model.play(vec![text("no usage in this answer")]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "and now?").unwrap();
    let zero = json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    assert_eq!(of_kind(&events, "end")[0]["usage"], zero, "{events:?}");

    let (status, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(status, 200, "{stored}");
    assert_eq!(
        stored["usage"],
        json!({
            "turns": [
                {"turn": 1, "prompt_tokens": 230, "completion_tokens": 16, "total_tokens": 246},
                {"turn": 2, "prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            ],
            "total": first,
        })
    );
    // Usage is not part of the conversation the model is sent.
    let last = setup.model.requests().last().unwrap().to_string();
    assert!(!last.contains("prompt_tokens"), "{last}");
}

/// A command that exits non-zero or times out ran (`ok`, its output goes to the model) but is
/// `failed`, summarised by its exit code and first stderr line or its timeout; the stored chat
/// gives its tool messages the same state and summary, and `agentworks chat --chat` shows the
/// earlier turn with them when resuming.
#[test]
fn failed_commands_are_failed_with_their_exit_code_and_stderr_and_a_reopened_chat_shows_them() {
    let setup = Setup::start(true);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    assert_eq!(setup.bind(&chat).0, 200);
    let sleeper = "sleep 63.5";
    setup.model.play(vec![
        calls(&[
            ("c1", "execute_shell_command", json!({"command": "echo fine"})),
            (
                "c2",
                "execute_shell_command",
                json!({"command": "echo partial; printf '\\n  make: *** No rule to make target test\\nmore\\n' >&2; exit 2"}),
            ),
            (
                "c3",
                "execute_shell_command",
                json!({"command": sleeper, "timeout": 1}),
            ),
        ]),
        text("Two of them failed."),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "run them").unwrap();
    let state = |id: &str| {
        let result = result_of(&events, id);
        (
            result["ok"].clone(),
            result["state"].as_str().unwrap_or_default().to_owned(),
            result["summary"].as_str().unwrap_or_default().to_owned(),
        )
    };
    assert_eq!(state("c1"), (json!(true), "done".into(), "exit 0".into()));
    assert_eq!(
        state("c2"),
        (
            json!(true),
            "failed".into(),
            "exit 2: make: *** No rule to make target test".into()
        )
    );
    assert_eq!(
        state("c3"),
        (json!(true), "failed".into(), "timed out after 1 s".into())
    );
    // The model still got the failed command's output.
    let results = tool_results(&setup.model.requests()[1]);
    assert_eq!(results[1].1["result"]["stdout"], "partial\n", "{results:?}");

    // Reopened: the stored tool messages carry the same state and summary.
    let (status, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    assert_eq!(status, 200, "{stored}");
    let tools: Vec<&Value> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tools.len(), 3, "{stored}");
    for message in tools {
        let id = message["tool_call_id"].as_str().unwrap();
        let (_, state_now, summary_now) = state(id);
        assert_eq!(message["state"], state_now.as_str(), "{message}");
        assert_eq!(message["summary"], summary_now.as_str(), "{message}");
    }
    assert!(
        stored["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["role"] == "tool" || m.get("state").is_none()),
        "only tool messages have a state: {stored}"
    );

    // The terminal client shows the earlier turn when it resumes the chat.
    let home = tempfile::tempdir().unwrap();
    let out = setup
        .chat_cli(home.path(), &["--chat", &chat])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let earlier: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "— earlier in this chat —")
        .take_while(|l| *l != "— now —")
        .collect();
    assert_eq!(earlier.len(), 6, "{stdout}");
    assert_eq!(earlier[1], "you> run them");
    assert_eq!(
        earlier[2],
        "  ✓ execute_shell_command echo fine — exit 0, 1 line of output"
    );
    assert!(
        earlier[3].starts_with("  ✗ execute_shell_command echo partial")
            && earlier[3].ends_with(" — exit 2: make: *** No rule to make target test"),
        "{stdout}"
    );
    assert_eq!(
        earlier[4],
        format!("  ✗ execute_shell_command {sleeper} — timed out after 1 s")
    );
    assert_eq!(earlier[5], "agent> Two of them failed.");
}

/// The model's answer is streamed: agentd asks for a stream (with usage), the text reaches the
/// turn's events in pieces as the endpoint sends them, and tool calls put back together from
/// their pieces run. An endpoint that ignores `stream` and answers JSON still works.
#[test]
fn answers_stream_in_pieces_and_an_endpoint_answering_json_still_works() {
    let setup = Setup::start(false);
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    setup.model.play(vec![
        calls(&[("r1", "read_file", json!({"path": "server.txt"}))]),
        with_usage(text("The file says: server file."), 5, 7),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "read it").unwrap();
    assert_eq!(
        result_of(&events, "r1")["result"]["content"],
        "server file\n"
    );
    let pieces = of_kind(&events, "text");
    assert!(pieces.len() > 1, "the answer came whole: {events:?}");
    assert_eq!(answer_text(&events), "The file says: server file.");
    assert_eq!(
        of_kind(&events, "end")[0]["usage"]["total_tokens"],
        12,
        "{events:?}"
    );
    let request = &setup.model.requests()[0];
    assert_eq!(request["stream"], true);
    assert_eq!(request["stream_options"]["include_usage"], true);
    // The stored answer is the whole text, once.
    let (_, stored) = api(
        &setup.stack,
        &setup.alice,
        "GET",
        &format!("/v1/chats/{chat}"),
        Value::Null,
    );
    let last = stored["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["content"], "The file says: server file.", "{last}");

    setup.model.ignore_stream();
    setup.model.play(vec![
        calls(&[("r2", "read_file", json!({"path": "server.txt"}))]),
        text("still fine"),
    ]);
    let events = turn(setup.stack.port, &setup.alice, &chat, "again").unwrap();
    assert_eq!(result_of(&events, "r2")["state"], "done", "{events:?}");
    assert_eq!(of_kind(&events, "text").len(), 1);
    assert_eq!(answer_text(&events), "still fine");
}
