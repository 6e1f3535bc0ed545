//! workspaced reached over NATS (issue 16): agentd with `[agentd] workspaced_host` calls the
//! workspaced of that cluster host on `agentworks.workspaced.<host>.call` instead of its socket,
//! with the same endpoints and answers, so documents can live on a host that runs no agentd.
//! Real PostgreSQL and nats-server from the harness, real workspaced and agentd.
//!
//! The socket is moved away once the stack is up, so only NATS can explain a write that still
//! lands. Then the attack: calls published straight on workspaced's subject (as any NATS user
//! could) without a MAC, or sealed under another key, write nothing; the same call sealed under
//! the cluster's key (read from the database, as a host would) does, which shows that the MAC
//! is all that stopped them.
//!
//! With `[agentd.project_workspaced_hosts]` the documents are spread over workspaced hosts:
//! each project's calls go to the one that holds it, and one host down fails its projects alone.

use super::harness::{
    Nats, Postgres, Stack, StateRoot, Workspaced, cluster_section, ctx, free_port, tool_result,
    wait_until,
};
use agentworks_contract::cluster::{PEER_MAC_HEADER, PeerCall, workspaced_subject};
use agentworks_daemon::bus::BusKey;
use serde_json::json;
use std::time::Duration;

const HOST: &str = "storage-1";

#[test]
fn agentd_writes_through_a_workspaced_on_nats_and_unsealed_calls_write_nothing() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let port = free_port();
    let stack = Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\nserve_cluster = true\n\n\
             [agentd]\nlisten = \"127.0.0.1:{port}\"\nworkspaced_host = \"{HOST}\"\n\n\
             {}",
            cluster_section(&postgres, &nats, HOST)
        ),
    );
    // The project's folder is made through workspaced, over NATS already.
    let (workflow, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    assert!(stack.state.documents().join("demo").is_dir());
    // From now on agentd cannot reach workspaced's socket at all.
    let socket = stack.workspaced.socket.clone();
    std::fs::rename(&socket, socket.with_extension("moved")).unwrap();

    let written = tool_result(
        port,
        &token,
        "write_file",
        json!({"workflow_id": workflow, "path": "notes.md", "content": "over nats\n",
               "expected_revision": "missing", "request_id": "bus-1"}),
    )
    .unwrap_or_else(|error| panic!("write_file over NATS: {error}"));
    assert!(written.get("revision").is_some(), "{written}");
    let on_disk = std::fs::read_to_string(stack.state.documents().join("demo/notes.md")).unwrap();
    assert_eq!(on_disk, "over nats\n");
    let read = tool_result(
        port,
        &token,
        "read_file",
        json!({"workflow_id": workflow, "path": "notes.md"}),
    )
    .unwrap_or_else(|error| panic!("read_file over NATS: {error}"));
    assert_eq!(read["content"], "over nats\n", "{read}");

    // The attack: a write published on workspaced's subject by someone without the key.
    let subject = workspaced_subject(HOST);
    let call = |path: &str| {
        serde_json::to_vec(&PeerCall {
            origin: "attacker".into(),
            sent_at_ms: agentworks_support::clock::now_ms(),
            path: "/v1/write".into(),
            body: json!({"context": ctx("demo", "mallory"), "path": path, "content": "pwned",
                         "expected_revision": "missing", "request_id": format!("forged-{path}")})
            .to_string(),
        })
        .unwrap()
    };
    let unsealed = call("unsealed.md");
    nats.publish_with_headers(&subject, &[], &unsealed);
    let wrong = call("wrong-key.md");
    let wrong_mac = BusKey::new([9; 32]).seal(&subject, &wrong);
    nats.publish_with_headers(&subject, &[(PEER_MAC_HEADER, &wrong_mac)], &wrong);
    // The cluster's own key, as a host reads it: the same call then writes.
    let hex_key = postgres.psql(
        "agentworks",
        "SELECT encode(key, 'hex') FROM cluster.keys WHERE name = 'workspaced-calls'",
    );
    let key: [u8; 32] = hex::decode(hex_key.trim()).unwrap().try_into().unwrap();
    let sealed = call("sealed.md");
    let mac = BusKey::new(key).seal(&subject, &sealed);
    nats.publish_with_headers(&subject, &[(PEER_MAC_HEADER, &mac)], &sealed);
    let documents = stack.state.documents().join("demo");
    wait_until("the sealed call writes", Duration::from_secs(10), || {
        documents.join("sealed.md").exists()
    });
    // Calls are served in the order they come; give the earlier ones the same time again.
    std::thread::sleep(Duration::from_millis(500));
    for forged in ["unsealed.md", "wrong-key.md"] {
        assert!(
            !documents.join(forged).exists(),
            "{forged} was written by a call without the cluster's key"
        );
    }
}

#[test]
fn a_workspaced_host_nobody_serves_is_a_clear_tool_error_and_nothing_else() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let port = free_port();
    // agentd calls "elsewhere", which no workspaced serves; this stack's workspaced is local.
    let stack = Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\n\n\
             [agentd]\nlisten = \"127.0.0.1:{port}\"\nworkspaced_host = \"elsewhere\"\n\n\
             {}",
            cluster_section(&postgres, &nats, HOST)
        ),
    );
    let _ = stack.admin_raw("users/add", json!({"name": "alice"}));
    let added = stack
        .admin_raw(
            "projects/add",
            json!({"name": "demo", "kind": "workflow", "owner": "alice"}),
        )
        .unwrap_err()
        .to_string();
    assert!(
        added.contains("no workspaced serves cluster host \"elsewhere\""),
        "{added}"
    );
    assert!(!stack.state.documents().join("demo").exists());
}

#[test]
fn each_project_is_read_and_written_on_the_workspaced_that_holds_it() {
    let postgres = Postgres::start();
    let nats = Nats::start();
    let cluster = |host: &str| cluster_section(&postgres, &nats, host);
    // storage-2: a workspaced with documents of its own, on a host that runs nothing else.
    let storage = StateRoot::new();
    storage.set_config(&format!(
        "[workspaced]\nallowed_users = []\nserve_cluster = true\n\n{}",
        cluster("storage-2")
    ));
    let storage_workspaced = Workspaced::start(&storage);
    // agentd's own workspaced (its socket) holds every project but "archive".
    let port = free_port();
    let stack = Stack::start_on(
        port,
        &format!(
            "[workspaced]\nallowed_users = []\n\n[agentd]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [agentd.project_workspaced_hosts]\narchive = \"storage-2\"\n\n{}",
            cluster("a-1")
        ),
    );
    let (demo, _) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let (archive, token) = stack.user_with_project("alice", "archive", &["workflows:write"]);
    let (here, there) = (stack.state.documents(), storage.documents());
    assert!(here.join("demo").is_dir() && !there.join("demo").exists());
    assert!(there.join("archive").is_dir() && !here.join("archive").exists());

    for (workflow, name) in [(&demo, "demo"), (&archive, "archive")] {
        let written = tool_result(
            port,
            &token,
            "write_file",
            json!({"workflow_id": workflow, "path": "notes.md", "content": format!("in {name}\n"),
                   "expected_revision": "missing", "request_id": format!("w-{name}")}),
        )
        .unwrap_or_else(|error| panic!("write_file in {name}: {error}"));
        assert!(written.get("revision").is_some(), "{written}");
    }
    let on = |root: &std::path::Path, folder: &str| {
        std::fs::read_to_string(root.join(folder).join("notes.md")).ok()
    };
    assert_eq!(on(&here, "demo").as_deref(), Some("in demo\n"));
    assert_eq!(on(&there, "archive").as_deref(), Some("in archive\n"));
    // The receipt is where the write was.
    let receipt = tool_result(
        port,
        &token,
        "get_write_receipt",
        json!({"workflow_id": archive, "request_id": "w-archive"}),
    )
    .unwrap_or_else(|error| panic!("get_write_receipt in archive: {error}"));
    assert_eq!(receipt["receipt"]["path"], "notes.md", "{receipt}");

    // storage-2 goes down: its project fails, clearly; the others do not notice.
    drop(storage_workspaced);
    let read = |workflow: &str| {
        tool_result(
            port,
            &token,
            "read_file",
            json!({"workflow_id": workflow, "path": "notes.md"}),
        )
    };
    let refused = read(&archive).unwrap_err();
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no workspaced serves cluster host \"storage-2\""),
        "{refused}"
    );
    assert_eq!(read(&demo).unwrap()["content"], "in demo\n");
}
