//! The real `agentworks-runnerd` on a [`StateRoot`] whose config the test wrote (its
//! `[runnerd.providers.*]`), and a turn streamed from its socket the way agentd reads it:
//! newline-delimited JSON events, read here through `curl --unix-socket -N` (what an operator
//! would type), one event at a time. [`Runnerd::start`] returns once the health endpoint
//! answers and panics if the daemon exits first; its stderr is inherited. Dropping it SIGKILLs
//! and reaps it.

use super::daemons::{as_daemon_on, send_signal, wait_ready};
use super::{Start, StateRoot, as_user, block_on};
use agentworks_support::unix_http::UnixClient;
use nix::sys::signal::Signal;
use serde_json::Value;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `agentworks-runnerd`.
pub struct Runnerd {
    pub child: Child,
    pub socket: PathBuf,
}

pub fn runnerd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_agentworks-runnerd")
}

impl Runnerd {
    /// Starts runnerd on `state` (with the config the test set) and waits for its health.
    pub fn start(state: &StateRoot) -> Runnerd {
        Runnerd::start_with(state, None)
    }

    /// Starts runnerd as `uid:gid` (who must own the state root: [`StateRoot::give_state_to`])
    /// in `cgroup` (delegated to that user), as systemd runs it with `Delegate=yes`.
    pub fn start_as(state: &StateRoot, uid: u32, gid: u32, cgroup: PathBuf) -> Runnerd {
        Runnerd::start_with(state, Some((uid, gid, cgroup)))
    }

    fn start_with(state: &StateRoot, user: Option<(u32, u32, PathBuf)>) -> Runnerd {
        let mut command = Command::new(runnerd_bin());
        as_daemon_on(&mut command, state.root());
        if let Some((uid, gid, cgroup)) = user {
            let start = Start {
                cgroup: Some(cgroup),
                terminal: false,
            };
            as_user(&mut command, uid, gid, start);
        }
        let child = command.spawn().expect("spawn runnerd");
        let socket = state.root().join("run/runnerd.sock");
        let mut daemon = Runnerd { child, socket };
        let client = UnixClient::new(&daemon.socket);
        block_on(wait_ready(
            &mut daemon.child,
            "runnerd",
            Duration::from_secs(20),
            || async { client.get::<Value>("/v1/health").await.is_ok() },
        ));
        daemon
    }

    /// Moves runnerd's socket away from the path agentd calls (it keeps serving at the new
    /// one, which this handle uses): a stack that reaches runnerd over NATS can then reach it
    /// no other way, so a turn that works went over NATS.
    pub fn only_over_nats(&mut self) {
        let moved = self.socket.with_extension("moved");
        std::fs::rename(&self.socket, &moved).unwrap();
        self.socket = moved;
    }

    pub fn get(&self, path: &str) -> Value {
        let client = UnixClient::new(&self.socket);
        block_on(client.get::<Value>(path)).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// Cancels a running turn; the answer's JSON (or the error envelope).
    pub fn cancel(&self, turn_id: &str) -> Value {
        let client = UnixClient::new(&self.socket);
        let path = format!("/v1/turns/{turn_id}/cancel");
        match block_on(client.post::<Value, Value>(&path, &serde_json::json!({}))) {
            Ok(v) => v,
            Err(e) => serde_json::json!({"error": e.to_string()}),
        }
    }

    /// Starts a turn; its events arrive on the returned [`Turn`].
    pub fn turn(&self, request: &Value) -> Turn {
        let mut curl = Command::new("curl")
            .args(["-sS", "-N", "--fail-with-body", "--unix-socket"])
            .arg(&self.socket)
            .args([
                "-X",
                "POST",
                "-H",
                "content-type: application/json",
                "--data-binary",
                "@-",
                "http://runnerd/v1/turns",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn curl");
        let mut stdin = curl.stdin.take().expect("curl's stdin");
        stdin
            .write_all(request.to_string().as_bytes())
            .expect("write the turn request");
        drop(stdin);
        let stdout = curl.stdout.take().expect("curl's stdout");
        let (sender, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({"type": "unparsed", "line": line}));
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        Turn { curl, events }
    }
}

impl Drop for Runnerd {
    fn drop(&mut self) {
        let _ = send_signal(&self.child, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// A turn's event stream.
pub struct Turn {
    curl: Child,
    events: mpsc::Receiver<Value>,
}

impl Turn {
    /// The next event, within `within` (panics otherwise, or when the stream ended).
    pub fn next(&self, within: Duration) -> Value {
        self.events
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no turn event within {within:?}: {e}"))
    }

    /// Every event up to and including the last (`end` or `error`), within `within`.
    pub fn finish(self, within: Duration) -> Vec<Value> {
        let deadline = std::time::Instant::now() + within;
        let mut all = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) => {
                    let last = matches!(event["type"].as_str(), Some("end" | "error"));
                    all.push(event);
                    if last {
                        return all;
                    }
                }
                Err(e) => panic!("the turn did not end within {within:?} ({e}); events: {all:#?}"),
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let _ = self.curl.kill();
        let _ = self.curl.wait();
    }
}

/// A turn's events of one `type`.
pub fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The output of the tool result whose call ran a command containing `needle`.
pub fn output_of<'a>(events: &'a [Value], needle: &str) -> &'a str {
    let call = of_type(events, "tool_call")
        .into_iter()
        .find(|c| c["command"].as_str().unwrap_or("").contains(needle))
        .unwrap_or_else(|| panic!("no tool call running {needle:?}: {events:#?}"));
    of_type(events, "tool_result")
        .into_iter()
        .find(|r| r["call_id"] == call["call_id"])
        .and_then(|r| r["output"].as_str())
        .unwrap_or_else(|| panic!("no result for {needle:?}: {events:#?}"))
}

/// The turn's last event, which must be its `end`.
pub fn ended(events: &[Value]) -> &Value {
    let last = events.last().expect("the turn sent events");
    assert_eq!(last["type"], "end", "the turn failed: {events:#?}");
    last
}
