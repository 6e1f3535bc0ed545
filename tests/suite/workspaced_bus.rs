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

use super::harness::{Nats, Postgres, Stack, ctx, free_port, tool_result, wait_until};
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
             [cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\nhost_id = \"{HOST}\"\n",
            postgres.url(),
            nats.url()
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
             [cluster]\ndatabase_url = \"{}\"\nnats_url = \"{}\"\nhost_id = \"{HOST}\"\n",
            postgres.url(),
            nats.url()
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
