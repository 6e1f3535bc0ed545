//! A cluster under load while its servers restart (issue 16): a [`GatewayPair`] with a
//! scripted executor on B that echoes every command, two callers dispatching without pause (one
//! as agentd does in a cluster, over NATS, one on B's socket), and first PostgreSQL, then
//! nats-server restarted under them, each down for a while.
//!
//! While a server is down a dispatch may fail, but with an error that names what failed; after
//! each restart both callers succeed again without any daemon being restarted; no request id
//! reaches the executor twice; and none is lost silently: every request the executor ran was
//! answered with its outcome, `unknown`/`pending`, or an error that does not claim it was not
//! sent.

use super::harness::{FakeExecutor, GatewayPair, Reply, device_token};
use agentworks_contract::executor::FolderAccess;
use agentworks_support::unix_http::UnixClient;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How each dispatch was answered: `Ok(state)` or `Err((code, message))`.
type Answers = Arc<Mutex<Vec<(String, Result<Value, (String, String)>)>>>;

/// One dispatch: its state, or the error's code and message.
type Dispatch = Box<dyn Fn(&Value) -> Result<Value, (String, String)> + Send>;

/// Dispatches `echo <id>` with `dispatch` in a loop until `stop`, recording every answer.
fn caller(
    name: &'static str,
    dispatch: Dispatch,
    alice: String,
    device_id: String,
    answers: Answers,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            n += 1;
            let id = format!("{name}-{n}");
            let body = json!({"user_id": alice, "device_id": device_id, "folder": "proj",
                              "request_id": id, "operation":
                              {"kind": "execute_shell_command", "command": format!("echo {id}"),
                               "timeout": 5}});
            let answer = dispatch(&body);
            if answer.is_err() {
                std::thread::sleep(Duration::from_millis(100));
            }
            answers.lock().unwrap().push((id, answer));
        }
    })
}

/// The answers recorded since `from` include a success of each caller.
fn both_succeed_since(answers: &Answers, from: usize) -> bool {
    let answers = answers.lock().unwrap();
    ["agentd", "on-b"].iter().all(|name| {
        answers[from.min(answers.len())..]
            .iter()
            .any(|(id, a)| id.starts_with(name) && a.as_ref().is_ok_and(|s| s["state"] == "done"))
    })
}

/// Waits (at most a minute) until both callers succeeded since answer `from`; panics with the
/// last answers and the database's devices and leases if they do not.
fn recovered(pair: &GatewayPair, answers: &Answers, what: &str, from: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !both_succeed_since(answers, from) {
        if std::time::Instant::now() > deadline {
            let answers = answers.lock().unwrap();
            let last = &answers[answers.len().saturating_sub(6)..];
            let devices = pair.postgres.psql(
                "agentworks",
                "SELECT string_agg(device_id || ' ' || user_id, ', ') FROM gateway_devices",
            );
            let leases = pair.postgres.psql(
                "agentworks",
                "SELECT string_agg(device_id || ' ' || host_id, ', ') FROM gateway_leases",
            );
            panic!(
                "timed out waiting until {what}; devices: {devices}; leases: {leases}; \
                 the last answers: {last:#?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn postgres_and_nats_restarts_under_load_lose_nothing_silently_and_run_nothing_twice() {
    let mut pair = GatewayPair::start();
    let (token, _, alice) = device_token(&pair.stack, "alice", &["devices:connect"]);
    let folders = [("proj", FolderAccess::ReadWrite)];
    let on_b = FakeExecutor::connect(pair.b.port, &token, "laptop", &folders, Reply::Echo)
        .expect("the executor was refused");
    let device_id = on_b.device_id.clone();
    let answers: Answers = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let agentd = pair.agentd("ag-1");
    let over_nats: Dispatch = Box::new(move |body| {
        agentd
            .json("/v1/dispatch", body.clone())
            .map_err(|(code, error)| {
                let message = error["message"].as_str().map(str::to_owned);
                match message {
                    Some(message) => (code, message),
                    None => ("transport".to_owned(), code),
                }
            })
    });
    let socket_b = pair.b.socket.clone();
    let on_b_socket: Dispatch = Box::new(move |body| {
        let client = UnixClient::new(&socket_b);
        super::harness::block_on(client.post::<_, Value>("/v1/dispatch", body)).map_err(|error| {
            match error {
                agentworks_support::unix_http::ClientError::Remote { body, .. } => {
                    (body.code, body.message)
                }
                other => ("transport".to_owned(), other.to_string()),
            }
        })
    });
    let callers = [
        caller(
            "agentd",
            over_nats,
            alice.clone(),
            device_id.clone(),
            answers.clone(),
            stop.clone(),
        ),
        caller(
            "on-b",
            on_b_socket,
            alice.clone(),
            device_id.clone(),
            answers.clone(),
            stop.clone(),
        ),
    ];
    recovered(
        &pair,
        &answers,
        "both callers succeed before any restart",
        0,
    );

    // PostgreSQL down for two seconds, then back.
    pair.postgres.stop();
    std::thread::sleep(Duration::from_secs(2));
    pair.postgres.start_again();
    let after_postgres = answers.lock().unwrap().len();
    recovered(
        &pair,
        &answers,
        "both callers succeed after PostgreSQL is back",
        after_postgres,
    );

    // nats-server down for two seconds, then a new one on its port.
    pair.nats.stop();
    std::thread::sleep(Duration::from_secs(2));
    pair.nats.restart();
    let after_nats = answers.lock().unwrap().len();
    recovered(
        &pair,
        &answers,
        "both callers succeed after NATS is back",
        after_nats,
    );

    stop.store(true, Ordering::SeqCst);
    for caller in callers {
        caller.join().unwrap();
    }
    let answers = answers.lock().unwrap();
    let sent: Vec<String> = on_b.requests().into_iter().map(|(id, _, _)| id).collect();
    let unique: HashSet<&String> = sent.iter().collect();
    assert_eq!(unique.len(), sent.len(), "an id reached the executor twice");

    let mut errors: HashMap<String, (usize, String)> = HashMap::new();
    for (id, answer) in answers.iter() {
        match answer {
            Ok(state) if state["state"] == "done" => {
                assert_eq!(state["outcome"]["stdout"], format!("echo {id}"), "{state}");
                assert!(unique.contains(id), "{id} answered done but never ran");
            }
            Ok(state) => {
                let undecided = state["state"] == "unknown" || state["state"] == "pending";
                assert!(undecided, "{id}: {state}");
            }
            Err((code, message)) => {
                // An error names what failed; the codes that say "not sent" must be true.
                assert!(!message.is_empty(), "{id}: {code} without a message");
                let not_sent = matches!(
                    code.as_str(),
                    "device_offline"
                        | "gateway_host_unavailable"
                        | "gateway_unavailable"
                        | "not_found"
                );
                assert!(
                    !(not_sent && unique.contains(id)),
                    "{id} ran on the device but was answered {code}: {message}"
                );
                let entry = errors.entry(code.clone()).or_insert((0, message.clone()));
                entry.0 += 1;
            }
        }
    }
    let done = answers
        .iter()
        .filter(|(_, a)| a.as_ref().is_ok_and(|s| s["state"] == "done"))
        .count();
    eprintln!(
        "{} dispatches, {done} done, {} ran on the device; errors while servers were down: {errors:#?}",
        answers.len(),
        sent.len()
    );
}
