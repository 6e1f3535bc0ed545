//! runnerd in a cluster (issue 46): the host that stores a project runs its coding CLIs, and
//! agentd on another host reaches that runnerd over NATS (`[runnerd] serve_cluster`,
//! `agentworks.runnerd.<host>.call`) as it reaches the workspaced there. Real PostgreSQL and
//! nats-server from the harness, the real daemons, the real Codex against the scripted
//! Responses server.
//!
//! Two hosts: `a-1` runs agentd (and no runnerd at all: nothing but NATS can explain a turn);
//! `storage-1` runs workspaced and runnerd on the documents. A Builder turn streams its text,
//! edits natively and through the bridge's patch (applied by agentd through the storage host's
//! workspaced); Stop cancels a turn there. While a turn runs, messages published on its inbox
//! without the key, under another key, or replayed from the turn itself change nothing. When
//! runnerd is SIGKILLed mid-turn, the turn ends within its heartbeat bound with
//! `runnerd_unreachable` naming the host, and no process of the CLI's tree is left.

use super::agent::{api, of_kind, turn, user};
use super::agent_cli::runnerd_config;
use super::harness::*;
use super::runner_support::codex_binary;
use super::runner_support::responses::{Reply, ScriptedResponses};
use agentworks_contract::cluster::{PEER_MAC_HEADER, TurnFrame};
use agentworks_daemon::bus::BusKey;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const STORAGE: &str = "storage-1";

/// A chat turn's events when it ends, or its refusal (as `agent::turn` returns them).
type TurnEvents = Result<Vec<(String, Value)>, (u16, Value)>;

/// agentd on `a-1` and the storage host's workspaced and runnerd, with the `codex` provider
/// against `model`; alice owns `app` (stored on `storage-1`).
struct TwoHosts {
    postgres: Postgres,
    nats: Nats,
    stack: Stack,
    storage: StateRoot,
    _workspaced: Workspaced,
    runnerd: Runnerd,
    _keys: tempfile::TempDir,
    alice: String,
}

impl TwoHosts {
    fn start(model: &ScriptedResponses) -> TwoHosts {
        let postgres = Postgres::start();
        let nats = Nats::start();
        let keys = tempfile::tempdir().unwrap();
        let storage = StateRoot::new();
        storage.set_config(&format!(
            "[workspaced]\nallowed_users = []\nserve_cluster = true\n\n{}\n{}",
            runnerd_config(keys.path(), &model.base_url()).replacen(
                "[runnerd]\n",
                "[runnerd]\nserve_cluster = true\n",
                1
            ),
            cluster_section(&postgres, &nats, STORAGE)
        ));
        let workspaced = Workspaced::start(&storage);
        let runnerd = Runnerd::start(&storage);
        let port = free_port();
        let stack = Stack::start_on(
            port,
            &format!(
                "[workspaced]\nallowed_users = []\n\n\
                 [agentd]\nlisten = \"127.0.0.1:{port}\"\nworkspaced_host = \"{STORAGE}\"\n\n{}",
                cluster_section(&postgres, &nats, "a-1")
            ),
        );
        let alice = user(&stack, "alice");
        storage.project("app", &[("a.txt", "alpha\n")]);
        stack.admin(
            "projects/add",
            json!({"name": "app", "kind": "code", "owner": "alice"}),
        );
        TwoHosts {
            postgres,
            nats,
            stack,
            storage,
            _workspaced: workspaced,
            runnerd,
            _keys: keys,
            alice,
        }
    }

    fn chat(&self, mode: &str) -> String {
        let (status, chat) = api(
            &self.stack,
            &self.alice,
            "POST",
            "/v1/chats",
            json!({"project": "app", "agent": "codex", "mode": mode}),
        );
        assert_eq!(status, 201, "{chat}");
        chat["chat_id"].as_str().unwrap().to_owned()
    }

    /// Runs a turn of `chat` on another thread; its events when it ends.
    fn turn_in_background(&self, chat: &str) -> std::thread::JoinHandle<TurnEvents> {
        let (port, token, chat) = (self.stack.port, self.alice.clone(), chat.to_owned());
        std::thread::spawn(move || turn(port, &token, &chat, "Wait a while."))
    }
}

/// Waits until the model was asked, then a moment for Codex to start the command.
fn wait_for_the_command(model: &ScriptedResponses) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while model.requests().is_empty() {
        assert!(Instant::now() < deadline, "Codex never asked the model");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
}

#[test]
fn a_codex_turn_runs_on_the_runnerd_of_the_host_that_stores_its_project() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![
            Reply::exec_command("c1", "echo native > project/b.txt && echo wrote"),
            Reply::McpCall {
                server: "bridge".into(),
                tool: "diff_patch_workspace_file".into(),
                call_id: "c2".into(),
                arguments: json!({"filepath": "a.txt", "diff": "@@ -1 +1 @@\n-alpha\n+beta\n"}),
            },
            Reply::Text("Both edited.".into()),
        ]))
        .unwrap();
    let hosts = TwoHosts::start(&model);
    // Nothing on a-1 answers for runnerd: its providers come from the storage host.
    assert!(!hosts.stack.state.root().join("run/runnerd.sock").exists());
    let (status, agents) = api(&hosts.stack, &hosts.alice, "GET", "/v1/agents", Value::Null);
    assert_eq!(status, 200, "{agents}");
    assert_eq!(agents["runnerd"]["running"], true, "{agents}");
    let codex = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "codex")
        .unwrap_or_else(|| panic!("no codex agent: {agents}"));
    assert_eq!(codex["available"], true, "{agents}");

    let chat = hosts.chat("builder");
    let events = turn(hosts.stack.port, &hosts.alice, &chat, "Edit both files.").unwrap();
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "completed",
        "{events:#?}"
    );
    let text: String = of_kind(&events, "text")
        .iter()
        .filter_map(|t| t["text"].as_str())
        .collect();
    assert!(text.contains("Both edited."), "{events:#?}");
    // Both edits are on the storage host, none on a-1.
    let root = hosts.storage.documents().join("app");
    assert_eq!(
        std::fs::read_to_string(root.join("b.txt")).unwrap(),
        "native\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("a.txt")).unwrap(),
        "beta\n"
    );
    assert!(!hosts.stack.state.documents().join("app").exists());
    let patch = of_kind(&events, "tool_call")
        .into_iter()
        .find(|c| c["name"] == "diff_patch_workspace_file")
        .unwrap_or_else(|| panic!("no bridge patch call: {events:#?}"));
    let result = of_kind(&events, "tool_result")
        .into_iter()
        .find(|r| r["id"] == patch["id"])
        .unwrap();
    assert_eq!(result["state"], "done", "{result}");
    assert!(result["result"].to_string().contains("receipt"), "{result}");
    // The model got the patch's answer back through the bridge, over NATS.
    let last = serde_json::to_string(model.requests().last().unwrap().input()).unwrap();
    assert!(last.contains("applied"), "{last}");
}

/// Every message on any inbox, as the NATS server delivers it to a subscriber of `_INBOX.>`
/// (any NATS user may be one).
fn watch_inboxes(
    runtime: &tokio::runtime::Runtime,
    nats: &Nats,
) -> Arc<Mutex<Vec<async_nats::Message>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = runtime.block_on(async_nats::connect(nats.url())).unwrap();
    let mut inboxes = runtime
        .block_on(client.subscribe("_INBOX.>".to_owned()))
        .unwrap();
    runtime.block_on(client.flush()).unwrap();
    let store = seen.clone();
    runtime.spawn(async move {
        use futures_util::StreamExt;
        let _client = client;
        while let Some(message) = inboxes.next().await {
            store.lock().unwrap().push(message);
        }
    });
    seen
}

#[test]
fn forged_and_replayed_frames_on_a_turns_inbox_change_nothing_and_stop_cancels_it_there() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![Reply::exec_command(
            "c1",
            "sleep 4721",
        )]))
        .unwrap();
    let hosts = TwoHosts::start(&model);
    let seen = watch_inboxes(&runtime, &hosts.nats);
    let chat = hosts.chat("run");
    let running = hosts.turn_in_background(&chat);
    wait_for_the_command(&model);
    wait_until("the command runs", Duration::from_secs(20), || {
        !processes_with("sleep 4721").is_empty()
    });

    // The turn's frames as any NATS user sees them: the inbox, the tool call's line.
    let frames: Vec<(async_nats::Message, TurnFrame)> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m.clone(), serde_json::from_slice(&m.payload).ok()?)))
        .collect();
    let (tool_call, _) = frames
        .iter()
        .find(|(_, f)| matches!(f, TurnFrame::Line { data, .. } if data.contains("\"tool_call\"")))
        .unwrap_or_else(|| panic!("no tool_call frame among {frames:#?}"));
    let inbox = tool_call.subject.to_string();
    let next = frames
        .iter()
        .filter(|(m, _)| m.subject.as_str() == inbox)
        .map(|(_, f)| f.seq())
        .max()
        .unwrap()
        + 1;
    // Forged text at the very number agentd waits for: without a MAC, and under another key.
    let forged = |seq: u64| {
        serde_json::to_vec(&TurnFrame::Line {
            seq,
            data: json!({"type": "text", "text": "FORGED"}).to_string(),
            more: false,
        })
        .unwrap()
    };
    hosts.nats.publish(&inbox, &forged(next));
    let other = forged(next);
    let wrong_mac = BusKey::new([9; 32]).seal(&inbox, &other);
    hosts
        .nats
        .publish_with_headers(&inbox, &[(PEER_MAC_HEADER, &wrong_mac)], &other);
    // runnerd's own sealed frame again: a replay.
    let mac = tool_call
        .headers
        .as_ref()
        .unwrap()
        .get(PEER_MAC_HEADER)
        .unwrap();
    hosts.nats.publish_with_headers(
        &inbox,
        &[(PEER_MAC_HEADER, mac.as_str())],
        &tool_call.payload,
    );
    // The key is what made the difference: the cluster's own seals a frame agentd would take.
    let hex_key = hosts.postgres.psql(
        "agentworks",
        "SELECT encode(key, 'hex') FROM cluster.keys WHERE name = 'runnerd-calls'",
    );
    let key: [u8; 32] = hex::decode(hex_key.trim()).unwrap().try_into().unwrap();
    assert!(BusKey::new(key).verify(&inbox, &tool_call.payload, mac.as_str()));
    // A heartbeat's time, so the forged frames were read before the turn stops.
    std::thread::sleep(Duration::from_secs(6));

    let stopped = Instant::now();
    let (status, body) = api(
        &hosts.stack,
        &hosts.alice,
        "POST",
        &format!("/v1/chats/{chat}/cancel"),
        Value::Null,
    );
    assert_eq!(status, 202, "{body}");
    let events = running.join().unwrap().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopped.elapsed()
    );
    assert_eq!(
        of_kind(&events, "end")[0]["reason"],
        "cancelled",
        "{events:#?}"
    );
    let all = serde_json::to_string(&events).unwrap();
    assert!(
        !all.contains("FORGED"),
        "a forged frame was taken: {events:#?}"
    );
    let calls = of_kind(&events, "tool_call");
    assert_eq!(calls.len(), 1, "a replayed frame was taken: {events:#?}");
    assert!(of_kind(&events, "error").is_empty(), "{events:#?}");
    // Stop reached the storage host's runnerd: the command is gone there.
    wait_until("the command is gone", Duration::from_secs(10), || {
        processes_with("sleep 4721").is_empty()
    });
}

/// The processes of the turns run on `storage` now: the launchers and anything naming the
/// state root on its command line, the Codex CLIs whose `CODEX_HOME` lies there, and `marker`.
fn turn_processes(storage: &StateRoot, marker: &str) -> Vec<String> {
    let root = storage.root().display().to_string();
    let mut found: Vec<String> = processes_with(&root)
        .into_iter()
        .filter(|p| !p.contains("agentworks-runnerd ") || p.contains("__sandbox-exec"))
        .collect();
    found.extend(processes_with(marker));
    for process in processes_with(&codex_binary().display().to_string()) {
        let pid = process.split(':').next().unwrap();
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if String::from_utf8_lossy(&environ).contains(&format!("CODEX_HOME={root}")) {
            found.push(process);
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn a_turn_whose_runnerd_dies_ends_with_runnerd_unreachable_and_leaves_no_process() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime
        .block_on(ScriptedResponses::start(vec![Reply::exec_command(
            "c1",
            "sleep 4731 & sleep 4732",
        )]))
        .unwrap();
    let mut hosts = TwoHosts::start(&model);
    let chat = hosts.chat("run");
    let running = hosts.turn_in_background(&chat);
    wait_for_the_command(&model);
    wait_until("the commands run", Duration::from_secs(20), || {
        !processes_with("sleep 4731").is_empty() && !processes_with("sleep 4732").is_empty()
    });
    let before = turn_processes(&hosts.storage, "sleep 473");
    assert!(
        before.iter().any(|p| p.contains("__sandbox-exec")),
        "no launcher found: {before:#?}"
    );

    let killed = Instant::now();
    // SIGKILL: runnerd ends nothing itself.
    hosts.runnerd.child.kill().unwrap();
    let _ = hosts.runnerd.child.wait();
    let events = running.join().unwrap().unwrap();
    let waited = killed.elapsed();
    let error = of_kind(&events, "error")
        .first()
        .copied()
        .cloned()
        .unwrap_or_else(|| panic!("no error event: {events:#?}"));
    assert_eq!(error["code"], "runnerd_unreachable", "{events:#?}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("cluster host \"{STORAGE}\"")),
        "{message}"
    );
    // Three heartbeats (15 s) of silence, and the moment the last one had already waited.
    assert!(waited < Duration::from_secs(25), "{waited:?}");
    wait_until("the CLI's tree is gone", Duration::from_secs(10), || {
        turn_processes(&hosts.storage, "sleep 473").is_empty()
    });
}
